package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

// version, when set at link time (go build -ldflags "-X main.version=v1.2.3"),
// is the version that 'keyswap version' prints. It is a package variable
// because -X can set nothing else.
var version string

const versionUsage = `Usage: keyswap version

Version prints "keyswap <version>", or with -json {"version": "<version>"}.
The version is the one given at link
time (-ldflags "-X main.version=..."), else the module version that the Go
toolchain recorded in the binary: v1.2.3 for 'go install
github.com/keyswap/keyswap/cmd/keyswap@v1.2.3', a pseudo-version or
"(devel)" for a build from a checkout. 'keyswap --version' is the same.`

// version is the 'keyswap version' command.
func (c *cli) version(_ context.Context, args []string) error {
	fs := newFlagSet("version")
	asJSON := fs.Bool("json", false, `print {"version": "..."} instead of a line`)
	positional, err := c.parse(fs, args, versionUsage)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return usagef("unexpected arguments %q", positional)
	}
	info, ok := debug.ReadBuildInfo()
	v := versionString(version, info, ok)
	if *asJSON {
		return writeJSON(c.stdout, struct {
			Version string `json:"version"`
		}{v})
	}
	_, err = fmt.Fprintf(c.stdout, "keyswap %s\n", v)
	return err
}

// versionString returns override when it is set, else the main module's
// version in info, else "(devel)".
func versionString(override string, info *debug.BuildInfo, ok bool) string {
	switch {
	case override != "":
		return override
	case ok && info.Main.Version != "":
		return info.Main.Version
	default:
		return "(devel)"
	}
}
