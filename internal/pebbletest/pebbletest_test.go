package pebbletest_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
)

// A CA whose directory cannot be fetched with RootsPEM as the only trust would be
// useless to the worker, which trusts exactly that file through --acme-ca-bundle.
func TestStart_DirectoryIsServedOverTLSTrustedByRoots(t *testing.T) {
	t.Parallel()
	ca := pebbletest.StartT(t, pebbletest.Options{})

	file, err := os.ReadFile(ca.RootsFile)
	require.NoError(t, err)
	require.Equal(t, ca.RootsPEM(), file, "RootsFile must hold RootsPEM")

	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca.RootsPEM()))
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
	}
	resp, err := client.Get(ca.DirectoryURL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var dir map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&dir))
	require.NotEmpty(t, dir["newOrder"])
	require.NotEmpty(t, dir["renewalInfo"], "ARI must be advertised")
	require.NotZero(t, ca.HTTPPort, "a free HTTP-01 port is picked when none is given")
	require.NotEmpty(t, ca.IssuerRootsPEM())
}

// Two CAs in one process with different options must each keep their own: Pebble
// reads its knobs from the environment, which Start changes and restores.
func TestStart_ParallelCAsWithDifferentOptionsAndCloseTwice(t *testing.T) {
	t.Parallel()
	a := pebbletest.StartT(t, pebbletest.Options{NonceReject: 50, ShortLifetime: 5 * time.Minute})
	b := pebbletest.StartT(t, pebbletest.Options{})
	require.NotEqual(t, a.DirectoryURL, b.DirectoryURL)
	_, set := os.LookupEnv("PEBBLE_WFE_NONCEREJECT")
	require.False(t, set, "Start must restore the environment")
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close twice")
	_, err := os.Stat(a.RootsFile)
	require.True(t, os.IsNotExist(err), "Close removes RootsFile")
}
