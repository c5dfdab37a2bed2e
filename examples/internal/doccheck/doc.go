// Package doccheck tests the repository's documentation, README.md and
// docs/*.md, as code: its tests build every Go block and check every
// relative link. It holds no code of its own.
//
// # Go blocks
//
// A ```go block that starts with a package clause is a complete file and
// is built as it is; the first block of README.md must be one, a program,
// and is built into a binary. Any other block is a fragment, built inside a
// scaffold (see scaffold in the test) that imports keyswap's packages,
// rueidis, go-redis and the standard packages the documents use, and
// declares the names fragments use without declaring them: ctx, client,
// users, emails, scores, countries, r (a *rebuild.Rebuilder[User]),
// oldUser, newUser, dsn and userFromRow (for the change relay), and the
// types User and Store. A fragment that starts
// with a declaration (type, func, var, const) is placed at the top level of
// the file; any other is the body of a function that returns an error.
// Compiler errors point at the document's lines.
//
// A block that cannot be built, such as one that shows a placeholder, is
// preceded by a comment that says why, which the tests require:
//
//	<!-- doccheck: skip: it shows the shape of the call, not its arguments -->
//
// # Links
//
// Every relative link must name a file or directory of the repository,
// and a heading of it when it has a #fragment. A link whose text names a
// test, benchmark or fuzz target (`TestSweep`) must point at a file that
// declares it, and every such name written as code anywhere in the
// documents must be declared by a _test.go file of the repository.
package doccheck
