module github.com/keyswap/keyswap/cmd/keyswap

go 1.25.0

require (
	github.com/keyswap/keyswap v0.1.0
	github.com/redis/rueidis v1.0.79
	github.com/schollz/progressbar/v3 v3.19.1
	golang.org/x/term v0.44.0
)

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/redis/rueidis/rueidiscompat v1.0.79 // indirect
	github.com/redis/rueidis/rueidishook v1.0.76 // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)
