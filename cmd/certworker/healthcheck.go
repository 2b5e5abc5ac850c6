package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// healthcheckCmd probes /readyz of the instance on this host, for container images
// with no shell or curl (docs/running.md, "Operating certworker"). It only ever exits
// 0 (ready) or 1: Docker reserves a health check's exit status 2, so a configuration
// it cannot use is a failure too, named in the message.
type healthcheckCmd struct {
	AdminListen string        `name:"admin-listen" env:"CERTWORKER_ADMIN_LISTEN" default:"127.0.0.1:9090" placeholder:"ADDR" empty:"off" group:"listeners" help:"The --admin-listen of the instance to probe (the same variable configures both)."`
	Timeout     time.Duration `name:"timeout" env:"CERTWORKER_TIMEOUT" default:"5s" group:"logs" help:"How long to wait for /readyz. /readyz itself gives the database 2 s."`
}

func (c *healthcheckCmd) Run(g *globals) error {
	target, err := probeAddr(c.AdminListen)
	if err != nil {
		return &failedError{err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+target+"/readyz", nil)
	if err != nil {
		return &failedError{fmt.Sprintf("--admin-listen: %v", err)}
	}
	// No proxy: the instance is on this host, and an HTTP_PROXY set for the worker's
	// way out must not carry the probe elsewhere.
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	resp, err := client.Do(req)
	if err != nil {
		return &failedError{fmt.Sprintf("not ready: %v", err)}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	msg := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return &failedError{fmt.Sprintf("not ready: /readyz answered %d: %s", resp.StatusCode, msg)}
	}
	fmt.Fprintln(g.stdout, msg)
	return nil
}

// probeAddr is where to reach an --admin-listen address from the same host: an
// address that listens on every interface (":9090", "0.0.0.0:9090", "[::]:9090") is
// reached on loopback.
func probeAddr(listen string) (string, error) {
	if listen == "" {
		return "", fmt.Errorf("--admin-listen is empty: the admin endpoints are off, there is nothing to probe")
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--admin-listen: %q is not host:port", listen)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}
