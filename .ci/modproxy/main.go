package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

// run is the program, with its arguments and where it reports.
func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("modproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "the proxy `DIR` to write into (created if missing)")
	version := fs.String("version", "", "the `version` of every module, e.g. v0.1.0")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: modproxy -o DIR -version vX.Y.Z MODULEDIR...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *version == "" || fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("-o, -version and at least one module directory are required")
	}
	now := time.Now().UTC().Truncate(time.Second)
	for _, dir := range fs.Args() {
		m, err := readModule(dir, *version)
		if err != nil {
			return err
		}
		files, err := gitFiles(dir)
		if err != nil {
			return err
		}
		if err := publish(*out, m, files, now); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "modproxy: %s@%s from %s\n", m.Version.Path, m.Version.Version, dir)
	}
	return nil
}
