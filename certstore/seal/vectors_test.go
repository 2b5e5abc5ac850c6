package seal_test

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore/seal"
)

// vector is one entry of testdata/vectors.json.
type vector struct {
	Name           string `json:"name"`
	KeyEncryption  string `json:"key_encryption_key"`
	KeyID          string `json:"key_id"`
	AssociatedData string `json:"associated_data"`
	Nonce          string `json:"nonce"`
	Plaintext      string `json:"plaintext"`
	Sealed         string `json:"sealed"`
}

// The committed vectors are what a second implementation (the proxy's own, in any
// language) checks itself against, so they must be this package's truth: each opens
// with the package's own Open, and by the steps docs/security.md gives with nothing
// of this package; sealing its plaintext under its key with its nonce gives its
// sealed text again, byte for byte; its key id is its key's; its plaintext is a
// PKCS #8 key. The wildcard's opens with its row's domain (*.base) and not with a
// name it serves. Guards against the vectors, the code and the documented steps
// drifting apart, which would send every other reader the wrong way, and against
// vectors nothing checks.
func TestVectors_OpenAndSealAgain(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/vectors.json")
	require.NoError(t, err)
	var file struct {
		Comment []string `json:"comment"`
		Vectors []vector `json:"vectors"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields() // a field misspelled in the file is not silently empty
	require.NoError(t, dec.Decode(&file))
	aads := map[string]bool{}
	for _, v := range file.Vectors {
		aads[v.AssociatedData] = true
	}
	require.Len(t, file.Vectors, 2)
	require.True(t, aads["shop.example"] && aads["*.shop.example"], "a plain name's and a wildcard's: %v", aads)

	for _, v := range file.Vectors {
		kek, err := seal.ParseKeyring(v.KeyEncryption) // as --key-encryption-key takes it
		require.NoError(t, err, v.Name)
		require.Len(t, kek, 1, v.Name)
		require.Equal(t, v.KeyID, seal.KeyID(kek[0]), v.Name)
		require.Equal(t, v.KeyID, seal.SealedKeyID(v.Sealed), v.Name)

		opened, err := kek.Open(v.Sealed, v.AssociatedData)
		require.NoError(t, err, v.Name)
		require.Equal(t, v.Plaintext, string(opened), v.Name)
		require.Equal(t, v.Plaintext, string(openAsDocumented(t, kek, v.Sealed, v.AssociatedData)), v.Name)

		nonce, err := hex.DecodeString(v.Nonce)
		require.NoError(t, err, v.Name)
		again, err := seal.SealV2ForTest(kek[0], nonce, []byte(v.Plaintext), v.AssociatedData)
		require.NoError(t, err, v.Name)
		require.Equal(t, v.Sealed, again, "%s: sealed again with its nonce", v.Name)
		payload, err := base64.StdEncoding.DecodeString(v.Sealed[strings.LastIndex(v.Sealed, ":")+1:])
		require.NoError(t, err, v.Name)
		require.Equal(t, nonce, payload[:12], "%s: the nonce comes first", v.Name)

		block, rest := pem.Decode(opened)
		require.NotNil(t, block, v.Name)
		require.Empty(t, rest, v.Name)
		require.Equal(t, "PRIVATE KEY", block.Type, v.Name)
		_, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		require.NoError(t, err, v.Name)

		if base, ok := strings.CutPrefix(v.AssociatedData, "*."); ok {
			_, err := kek.Open(v.Sealed, "www."+base)
			require.ErrorIs(t, err, seal.ErrUnseal, "%s: opened with the name asked for rather than the row's", v.Name)
		}
		_, err = kek.Open(v.Sealed, strings.ToUpper(v.AssociatedData))
		require.ErrorIs(t, err, seal.ErrUnseal, "%s: the associated data is in lower case", v.Name)
	}
}
