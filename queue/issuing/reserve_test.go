package issuing_test

import (
	"testing"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// --limit-tenant-reserve: a percentage or a fraction, 0 to 50%.
func TestParseTenantReserve(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"25%": 0.25, "0": 0, "0%": 0, " 50% ": 0.5, "0.1": 0.1, "12.5%": 0.125} {
		got, err := issuing.ParseTenantReserve(in)
		require.NoError(t, err, in)
		require.InDelta(t, want, got, 1e-12, in)
	}
	for _, in := range []string{"", "51%", "-1%", "lots", "NaN", "0.6"} {
		_, err := issuing.ParseTenantReserve(in)
		require.Error(t, err, in)
	}
}
