// Modproxy writes module versions from a working tree into a file-system
// module proxy, in the layout and zip format that the go command reads
// through GOPROXY=file://DIR, so that 'go install module/pkg@version' and
// 'go get module@version' can be tried before the version is tagged.
//
// Usage:
//
//	modproxy -o DIR -version v0.1.0 MODULEDIR...
//
// Each MODULEDIR holds a go.mod; its module path is read from there. A
// module's files are those git lists in MODULEDIR, tracked or untracked
// but not ignored (git ls-files --cached --others --exclude-standard), that
// exist in the working tree: about what a tag of the tree as it is would
// hold. Files of nested modules (directories with a go.mod of their own)
// are left out, as from any module zip. For each module modproxy writes
// DIR/<module>/@v/<version>.info, .mod and .zip, and adds the version to
// DIR/<module>/@v/list. Paths and versions are escaped as the GOPROXY
// protocol says (an upper-case letter becomes '!' and its lower case).
//
// The zip is made by golang.org/x/mod/zip, the package the go command's
// own zips come from, so its file names, omissions and limits are the go
// command's, and the hash the go command computes of it (go.sum's h1:) is
// what it would compute of the same files fetched from a real proxy.
package main
