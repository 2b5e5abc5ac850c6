package loopback

import (
	"errors"
	"net"
)

// ListenUDPAndTCP listens on one port of 127.0.0.1 for both UDP and TCP, as a DNS
// server does. A port is picked for TCP and then taken for UDP too; when another
// socket holds it for UDP, it tries another port, up to 20 times (a UDP port picked
// first and taken for TCP after fails the same way, and did, beside parallel tests).
func ListenUDPAndTCP() (net.PacketConn, net.Listener, error) {
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		pc, err := net.ListenPacket("udp", ln.Addr().String())
		if err != nil {
			_ = ln.Close()
			continue
		}
		return pc, ln, nil
	}
	return nil, nil, errors.New("no loopback port free for both UDP and TCP")
}
