package queue_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A plain UPDATE of ssl_profile back to the profile the CA once refused for the
// domain (ssl_profile_refused) does what certworker_set_profile does with the same
// value: the refusal is forgotten and the active domain whose certificate has another
// profile is queued at once, for the next order to ask the CA again. BEFORE triggers
// fire in name order: certworker_profile_changed judged the write by the refusal that
// certworker_profile_set, firing after it, then forgot, so the row stayed active with
// no refusal left, and only the housekeeping queued it, up to 10 minutes later.
// Guards against the two ways of writing a profile disagreeing.
func TestProfileTrigger_APlainUpdateBackToARefusedProfileDoesAsSetProfile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	byFunction, _ := b.issued(t, tenant, "classic", ptr("classic"))
	byUpdate, _ := b.issued(t, tenant, "classic", ptr("classic"))
	b.exec(t, `UPDATE proxy_domains SET ssl_profile_refused = 'shortlived' WHERE id IN ($1, $2)`, byFunction, byUpdate)

	d, err := b.q.SetProfile(b.ctx, byFunction, tenant, ptr("shortlived"))
	require.NoError(t, err)
	require.NotNil(t, d)
	b.exec(t, `UPDATE proxy_domains SET ssl_profile = 'shortlived', updated_at = now() WHERE id = $1`, byUpdate)

	for _, id := range []string{byFunction, byUpdate} {
		r := b.profileRow(t, id)
		require.Nil(t, r.Refused, "the refusal outlived the profile written")
		require.Equal(t, "pending", *r.Status, "a profile written back to the refused one did not queue the replacement")
		require.Zero(t, r.Attempts)
	}
}
