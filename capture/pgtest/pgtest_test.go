package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestStartLogical(t *testing.T) {
	s := Own(t)
	dsn := s.Database(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var level string
	if err := c.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("wal_level = %q, want logical", level)
	}
	if err := s.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	s.Exec(t, dsn, "CREATE TABLE x (id int)")
}
