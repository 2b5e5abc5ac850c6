package queue

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// What a snapshot sees, from its text form: ended below xmin, running from xmax on,
// running between them when listed. A stream's 32-bit id is widened next to xmax,
// across an epoch boundary either way.
func TestSnapshot_SeesWhatEndedBeforeIt(t *testing.T) {
	t.Parallel()
	s, err := parseSnapshot("100:105:100,103")
	require.NoError(t, err)
	for xid, want := range map[uint32]bool{99: true, 100: false, 101: true, 102: true, 103: false, 104: true, 105: false, 106: false} {
		require.Equal(t, want, s.sees(xid), "xid %d", xid)
	}

	// xmax just past an epoch boundary: 2^32 + 2. The 32-bit id 4294967295 is the
	// last of the previous epoch, ended; 1 is this epoch's, running.
	s, err = parseSnapshot("4294967290:4294967298:4294967297")
	require.NoError(t, err)
	require.True(t, s.sees(4294967295))
	require.False(t, s.sees(1), "2^32+1 is listed as running")
	require.False(t, s.sees(2), "2^32+2 is xmax")
	require.True(t, s.sees(0xFFFFFFF0), "ended long before xmin")

	s, err = parseSnapshot("4294967294:4294967295:")
	require.NoError(t, err)
	require.False(t, s.sees(4294967295))
	require.False(t, s.sees(0), "the next epoch's first id has not begun")
}

func TestSnapshot_RejectsWhatIsNotOne(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"", "1:2", "a:2:", "1:b:", "3:2:", "1:5:x", "1:2:3:4"} {
		_, err := parseSnapshot(text)
		require.Error(t, err, "%q", text)
		require.Contains(t, err.Error(), "snapshot")
	}
}
