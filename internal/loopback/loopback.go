// Package loopback serves HTTPS on 127.0.0.1 with a given tls.Config, and opens
// https://NAME through it as a client would once NAME's DNS pointed at it: for the
// tests and benchmark of package certstore, and for `make demo`, which ends by opening
// each demo domain over HTTPS through a server whose certificates come from a
// certstore.Store:
//
//	srv, err := loopback.Serve(&tls.Config{GetCertificate: store.GetCertificate})
//	defer srv.Close()
//	leaf, err := srv.Get(ctx, "shop1.example", roots) // the certificate presented
//
// Every call opens a new connection and makes a full handshake (no session
// resumption), so it shows what a new visitor would get.
//
// ListenUDPAndTCP takes one loopback port for both UDP and TCP, for the tests' DNS
// servers.
package loopback

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"
)

// Server is an HTTPS server on a port of 127.0.0.1 that answers every request with
// 200 and "hello NAME".
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Serve starts a Server with cfg (which must give certificates, through
// Certificates or GetCertificate). Close stops it.
func Serve(cfg *tls.Config) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("loopback: listen: %w", err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "hello %s\n", r.TLS.ServerName)
		}),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 5 * time.Second,
		// A refused handshake is what some tests are about, not news.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return &Server{ln: ln, srv: srv}, nil
}

// Addr is the server's address, 127.0.0.1:PORT.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server and closes its connections.
func (s *Server) Close() error { return s.srv.Close() }

// Handshake makes a TLS handshake with the server, sending name as the server name
// (SNI), and returns the leaf certificate the server presented. With roots the chain
// is verified for name against them; with nil it is not verified (a benchmark's
// client should not spend its CPU on that).
func (s *Server) Handshake(ctx context.Context, name string, roots *x509.CertPool) (*x509.Certificate, error) {
	conn, err := (&tls.Dialer{Config: clientConfig(name, roots)}).DialContext(ctx, "tcp", s.Addr())
	if err != nil {
		return nil, fmt.Errorf("loopback: handshake for %s: %w", name, err)
	}
	defer conn.Close()
	return leaf(conn.(*tls.Conn).ConnectionState())
}

// Get opens https://name/ through the server, verifying the chain for name against
// roots, and returns the leaf the server presented once it has answered 200.
func (s *Server) Get(ctx context.Context, name string, roots *x509.CertPool) (*x509.Certificate, error) {
	tr := &http.Transport{
		// DNS says name is this server: whatever address the URL asks for, dial it.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, s.Addr())
		},
		TLSClientConfig:   clientConfig(name, roots),
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+name+"/", nil)
	if err != nil {
		return nil, fmt.Errorf("loopback: %w", err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("loopback: GET https://%s/: %w", name, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		return nil, fmt.Errorf("loopback: GET https://%s/: %s", name, resp.Status)
	}
	return leaf(*resp.TLS)
}

func clientConfig(name string, roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		ServerName:         name,
		RootCAs:            roots,
		InsecureSkipVerify: roots == nil, //nolint:gosec // a benchmark's choice, documented on Handshake
		MinVersion:         tls.VersionTLS12,
	}
}

func leaf(cs tls.ConnectionState) (*x509.Certificate, error) {
	if len(cs.PeerCertificates) == 0 {
		return nil, errors.New("loopback: the server presented no certificate")
	}
	return cs.PeerCertificates[0], nil
}
