package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

// mod is one module version to publish: its path and version, and the
// contents of its go.mod.
type mod struct {
	Version module.Version
	GoMod   []byte
}

// readModule reads the go.mod in dir and returns the module at version.
// The version must be canonical semver (v1.2.3, v1.2.3-rc.1) and agree with
// the path's major version suffix (v2.x.x for a path ending in /v2).
func readModule(dir, version string) (mod, error) {
	name := filepath.Join(dir, "go.mod")
	data, err := os.ReadFile(name)
	if err != nil {
		return mod{}, err
	}
	path := modfile.ModulePath(data)
	if path == "" {
		return mod{}, fmt.Errorf("%s: no module directive", name)
	}
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return mod{}, fmt.Errorf("version %q is not a canonical semantic version such as v0.1.0", version)
	}
	v := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		return mod{}, err
	}
	return mod{Version: v, GoMod: data}, nil
}

// info is the JSON of a version's .info file.
type info struct {
	Version string
	Time    time.Time
}

// publish writes m into the proxy directory dir: its .info (stamped t),
// .mod and .zip, made of files, and its version in the module's list. A
// version already there is overwritten.
func publish(dir string, m mod, files []zip.File, t time.Time) error {
	escPath, err := module.EscapePath(m.Version.Path)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(m.Version.Version)
	if err != nil {
		return err
	}
	vdir := filepath.Join(dir, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(vdir, escVersion)

	var zbuf bytes.Buffer
	if err := zip.Create(&zbuf, m.Version, files); err != nil {
		return err
	}
	if err := os.WriteFile(base+".zip", zbuf.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(base+".mod", m.GoMod, 0o644); err != nil {
		return err
	}
	js, err := json.Marshal(info{Version: m.Version.Version, Time: t})
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".info", js, 0o644); err != nil {
		return err
	}
	return addToList(filepath.Join(vdir, "list"), m.Version.Version)
}

// addToList adds version to the list file at name, one version a line in
// semver order, unless it is there already.
func addToList(name, version string) error {
	data, err := os.ReadFile(name)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	versions := strings.Fields(string(data))
	if slices.Contains(versions, version) {
		return nil
	}
	versions = append(versions, version)
	semver.Sort(versions)
	return os.WriteFile(name, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
