package loopback_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/loopback"
)

// selfSigned is a certificate for name that is its own root.
func selfSigned(t *testing.T, name string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
}

// Get opens https://NAME through the server, sending NAME as SNI, and verifies the
// chain against the roots given: what the demo relies on to say a domain is served.
// Guards against a helper that reports success for a certificate a browser would
// refuse.
func TestServer_GetAndHandshakePresentTheCertificateForTheName(t *testing.T) {
	t.Parallel()
	cert, roots := selfSigned(t, "shop.example")
	var sni string
	srv, err := loopback.Serve(&tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		sni = h.ServerName
		return &cert, nil
	}})
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	leaf, err := srv.Get(ctx, "shop.example", roots)
	require.NoError(t, err)
	require.Equal(t, int64(42), leaf.SerialNumber.Int64())
	require.Equal(t, "shop.example", sni)

	leaf, err = srv.Handshake(ctx, "shop.example", roots)
	require.NoError(t, err)
	require.Equal(t, int64(42), leaf.SerialNumber.Int64())
	_, err = srv.Handshake(ctx, "other.example", nil)
	require.NoError(t, err, "without roots the chain is not verified")

	_, err = srv.Get(ctx, "other.example", roots)
	require.ErrorContains(t, err, "other.example", "the certificate does not cover the name")
	_, otherRoots := selfSigned(t, "shop.example")
	_, err = srv.Get(ctx, "shop.example", otherRoots)
	require.ErrorContains(t, err, "certificate", "a chain to roots not given is refused")
}

// ListenUDPAndTCP gives one port for both: a datagram sent to the TCP listener's
// address reaches the packet conn, and a TCP connection to it is accepted.
func TestListenUDPAndTCP_OnePortForBoth(t *testing.T) {
	t.Parallel()
	pc, ln, err := loopback.ListenUDPAndTCP()
	require.NoError(t, err)
	defer pc.Close()
	defer ln.Close()
	require.Equal(t, ln.Addr().(*net.TCPAddr).Port, pc.LocalAddr().(*net.UDPAddr).Port)

	u, err := net.Dial("udp", ln.Addr().String())
	require.NoError(t, err)
	defer u.Close()
	_, err = u.Write([]byte("ping"))
	require.NoError(t, err)
	require.NoError(t, pc.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 16)
	n, _, err := pc.ReadFrom(buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf[:n]))

	c, err := net.Dial("tcp", pc.LocalAddr().String())
	require.NoError(t, err)
	defer c.Close()
	accepted, err := ln.Accept()
	require.NoError(t, err)
	require.NoError(t, accepted.Close())
}
