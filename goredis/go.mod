module github.com/keyswap/keyswap/goredis

go 1.25.0

require (
	github.com/keyswap/keyswap v0.1.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/redis/rueidis v1.0.79
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/redis/rueidis/rueidiscompat v1.0.79 // indirect
	github.com/redis/rueidis/rueidishook v1.0.76 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)
