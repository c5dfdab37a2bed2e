module github.com/keyswap/keyswap

go 1.25.0

require github.com/redis/rueidis v1.0.79

require golang.org/x/sys v0.47.0 // indirect
