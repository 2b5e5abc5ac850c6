package netrelay_test

import (
	"bufio"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/netrelay"
)

// echo serves lines back to the sender until the test ends.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s := bufio.NewScanner(c)
				for s.Scan() {
					if _, err := c.Write(append(s.Bytes(), '\n')); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, within time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return line, err
}

func TestRelay_BlackholeHoldsBytesUntilRestore(t *testing.T) {
	r := netrelay.Start(t, echo(t))
	c, err := net.Dial("tcp", r.Addr())
	require.NoError(t, err)
	defer c.Close()
	got, err := roundTrip(c, "one", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "one\n", got)

	r.Blackhole()
	_, err = roundTrip(c, "two", 200*time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne, "a black hole answers nothing, and closes nothing")
	require.True(t, ne.Timeout())

	r.Restore()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "two\n", line, "held bytes are delivered once the network is back")
}

func TestRelay_CutResetsConnectionsAndRefusesNewOnes(t *testing.T) {
	r := netrelay.Start(t, echo(t))
	c, err := net.Dial("tcp", r.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = roundTrip(c, "one", 5*time.Second)
	require.NoError(t, err)

	r.Cut()
	_, err = roundTrip(c, "two", 5*time.Second)
	require.Error(t, err)
	var ne net.Error
	if errors.As(err, &ne) {
		require.False(t, ne.Timeout(), "a cut connection fails at once, it does not go silent")
	}
	if c2, err := net.Dial("tcp", r.Addr()); err == nil {
		_, err = roundTrip(c2, "three", 5*time.Second)
		require.Error(t, err, "a new connection through a cut relay reaches nothing")
		c2.Close()
	}

	r.Restore()
	c3, err := net.Dial("tcp", r.Addr())
	require.NoError(t, err)
	defer c3.Close()
	got, err := roundTrip(c3, "four", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "four\n", got)
}
