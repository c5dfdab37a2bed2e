module github.com/keyswap/keyswap

go 1.25.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/redis/rueidis v1.0.79
	github.com/redis/rueidis/rueidiscompat v1.0.79
	github.com/redis/rueidis/rueidishook v1.0.76
	golang.org/x/sync v0.22.0
	golang.org/x/time v0.15.0
)

require golang.org/x/sys v0.47.0 // indirect
