package connect

import (
	"context"
	"errors"
	"testing"

	"github.com/keyswap/keyswap/reader"
	"github.com/redis/rueidis"
)

// The embedded miniredis, the examples' default Redis, has no client
// tracking: rueidis refuses to connect to it with client-side caching, so
// Open disables it, and a reader resolves every pointer with a GET.
func TestReaderOnEmbeddedRedis(t *testing.T) {
	ctx := context.Background()
	url, stop, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := rueidis.NewClient(opt); !errors.Is(err, rueidis.ErrNoCache) {
		if err == nil {
			c.Close()
		}
		t.Fatalf("rueidis connected to miniredis with client-side caching: %v; want ErrNoCache", err)
	}

	c, _, closeFn, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	r, err := reader.New(c, reader.Options{})
	if err != nil {
		t.Fatal(err)
	}
	do := func(cmd rueidis.Completed) {
		t.Helper()
		if err := c.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	do(c.B().Hset().Key("users:by-email").FieldValue().FieldValue("ada", "plain").Build())
	if v, ok, err := r.HGet(ctx, reader.Plain("users:by-email"), "ada"); err != nil || !ok || v != "plain" {
		t.Errorf("HGet without a pointer = %q, %v, %v; want plain", v, ok, err)
	}
	if r.Cached() {
		t.Error("Cached() = true on miniredis")
	}

	do(c.B().Hset().Key("users:by-email:rebuild-g:2").FieldValue().FieldValue("ada", "two").Build())
	do(c.B().Set().Key("users:by-email:rebuild-ptr").Value("2").Build())
	if v, ok, err := r.HGet(ctx, reader.Plain("users:by-email"), "ada"); err != nil || !ok || v != "two" {
		t.Errorf("HGet with pointer 2 = %q, %v, %v; want two", v, ok, err)
	}
	do(c.B().Set().Key("users:by-email:rebuild-ptr").Value("two").Build())
	if _, err := r.Key(ctx, "users:by-email"); !errors.Is(err, reader.ErrBadPointer) {
		t.Errorf("Key with pointer \"two\": %v; want ErrBadPointer", err)
	}
}
