package pgcdc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// TestRelayAppliesChanges: inserts, updates and deletes reach the index,
// in commit order, and an update that leaves a TOAST column unchanged
// keeps its entry (the value comes from the old row).
func TestRelayAppliesChanges(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	// Out-of-line storage: a long email is TOASTed, and an update that does
	// not change it sends it without a value.
	pg.Exec(t, f.dsn, `ALTER TABLE users ALTER COLUMN email SET STORAGE EXTERNAL`)
	r := f.relay(t, f.options())
	stop := running(t, r)
	long := strings.Repeat("x", 5000) + "@example.com"
	pg.Exec(t, f.dsn,
		`INSERT INTO users (id, email, country, score) VALUES (1, 'a@example.com', 'fr', 1), (2, 'b@example.com', 'de', 2), (3, '`+long+`', 'nl', 3)`,
		`UPDATE users SET email = 'a2@example.com', country = 'be' WHERE id = 1`,
		`DELETE FROM users WHERE id = 2`,
		`UPDATE users SET score = 30 WHERE id = 3`, // email: an unchanged TOAST value
		`BEGIN; INSERT INTO users (id, email, country) VALUES (4, 'd@example.com', 'fr'); UPDATE users SET country = 'es' WHERE id = 4; COMMIT`,
	)
	f.waitIndex(t)
	redistest.WantHash(t, f.client, f.prefix+"by-email", map[string]string{"a2@example.com": "1", long: "3", "d@example.com": "4"})
	waitFor(t, "every change applied", func() bool { return r.Status().Applied == 8 && r.Status().Pending == 0 })
	st := r.Status()
	if !st.Connected || st.Position == "" || st.Err != nil || st.LastApplied.IsZero() {
		t.Errorf("status %+v: want connected, a position, no error", st)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel: %v, want context.Canceled", err)
	}
}

// TestRelayAcknowledgesWhatItApplied: the slot's confirmed position moves
// past a transaction only after its changes are applied, and a restarted
// relay resumes from it.
func TestRelayResumesFromSlot(t *testing.T) {
	f := newFixture(t, pg, env.Standalone.Client(t))
	r := f.relay(t, f.options())
	stop := running(t, r)
	pg.Exec(t, f.dsn, `INSERT INTO users (id, email) VALUES (1, 'a@example.com')`)
	f.waitIndex(t)
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	// Changes committed while no relay runs wait in the slot.
	pg.Exec(t, f.dsn, `UPDATE users SET email = 'b@example.com' WHERE id = 1`, `INSERT INTO users (id, email) VALUES (2, 'c@example.com')`)
	got := redisIndex(t, f.client, f.prefix)
	if got.Emails["a@example.com"] != "1" || len(got.Emails) != 1 {
		t.Fatalf("with no relay running, the index changed: %v", got.Emails)
	}
	r2 := f.relay(t, f.options())
	running(t, r2)
	f.waitIndex(t)
}
