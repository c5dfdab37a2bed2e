package goredis_test

import (
	"context"
	"log"
	"os"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/goredis"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

type User struct{ ID, Email string }

// The application keeps its go-redis client; keyswap gets a rueidis client
// of the same server, from the same URL. (It needs a Redis, so it is not
// run.)
func ExampleClientOption() {
	o, err := redis.ParseURL(os.Getenv("REDIS_URL")) // redis://user:pass@host:6379/2, rediss://…, unix://…
	if err != nil {
		log.Fatal(err)
	}
	app := redis.NewClient(o) // the application's client, as before
	defer app.Close()
	client, err := rueidis.NewClient(goredis.ClientOption(o)) // keyswap's
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	emails := builders.Hash("users:by-email", func(u User) (field, value string, ok bool) {
		return u.Email, u.ID, !builders.Blank(u.Email)
	})
	r, err := rebuild.New(client, rebuild.Options{}, emails)
	if err != nil {
		log.Fatal(err)
	}
	users := []User{{ID: "1", Email: "ada@example.com"}}
	if _, err := r.Run(context.Background(), sources.Slice(users)); err != nil {
		log.Fatal(err)
	}
}

// A master that Redis Sentinel monitors: the URL's user and password are
// the sentinels', the master's are parameters, as redis.ParseFailoverURL
// reads them. (It needs a Redis, so it is not run.)
func ExampleFailoverClientOption() {
	o, err := redis.ParseFailoverURL("redis://:sentinel-pw@10.0.0.5:26379/2?addr=10.0.0.6:26379&master_name=mymaster&password=master-pw")
	if err != nil {
		log.Fatal(err)
	}
	client, err := rueidis.NewClient(goredis.FailoverClientOption(o))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
}
