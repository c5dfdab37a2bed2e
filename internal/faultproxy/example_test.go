package faultproxy_test

import (
	"context"
	"log"
	"time"

	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/redis/rueidis"
)

// A client that talks to Redis through a Proxy, and a command that times out
// during a stall.
func ExampleProxy() {
	p, err := faultproxy.New("127.0.0.1:6379")
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{p.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	p.Stall(2 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = c.Do(ctx, c.B().Ping().Build()).Error() // context.DeadlineExceeded
	log.Println(err)
}

// A cluster client whose every connection passes a Proxy, and a fault on the
// node that serves one key.
func ExampleDialer() {
	var d faultproxy.Dialer
	defer d.Close()
	nodes := []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  nodes,
		DisableCache: true,
		DialCtxFn:    d.Dial,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	p, err := d.Proxy(nodes[0]) // The node that serves the key, from redistest.Cluster.NodeFor.
	if err != nil {
		log.Fatal(err)
	}
	p.CutAfter(faultproxy.ToClient, 0) // The next reply from that node is lost.
}
