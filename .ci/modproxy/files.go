package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/mod/zip"
)

// gitFiles returns the files of the working tree under dir that git
// lists, tracked or untracked but not ignored, as zip.Files whose paths are
// relative to dir. A tracked file deleted from the working tree is left
// out: the tree as it is, not as it was committed, is what gets published.
func gitFiles(dir string) ([]zip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %v: %s", dir, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var files []zip.File
	seen := map[string]bool{}
	for _, name := range bytes.Split(out, []byte{0}) {
		if len(name) == 0 || seen[string(name)] {
			continue // the last NUL; a path listed twice (staged and modified)
		}
		seen[string(name)] = true
		slash := string(name) // git lists paths with slashes on every system
		path := filepath.Join(dir, filepath.FromSlash(slash))
		info, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		files = append(files, diskFile{slash: slash, path: path, info: info})
	}
	return files, nil
}

// diskFile is a file of the working tree, as zip.Create reads it.
type diskFile struct {
	slash string // the path in the module, with slashes
	path  string // the path on disk
	info  fs.FileInfo
}

func (f diskFile) Path() string                 { return f.slash }
func (f diskFile) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.path) }
