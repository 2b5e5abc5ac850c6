package listener

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A worker that stops taking the announced ids does not make the waker grow without
// bound: the newest maxAnnounced are kept, in order.
func TestLogical_KeepsTheNewestAnnouncedIDs(t *testing.T) {
	t.Parallel()
	lg := &Logical{}
	for x := range uint32(maxAnnounced + 6) {
		lg.announce(x)
	}
	got := lg.Announced()
	require.Len(t, got, maxAnnounced)
	require.Equal(t, uint32(6), got[0])
	require.Equal(t, uint32(maxAnnounced+5), got[len(got)-1])
	require.Nil(t, lg.Announced())
}
