// The module path is not fetchable on purpose: .ci cannot be an element of
// an import path (none may start with a dot), and nothing imports this
// program.
module keyswap.invalid/modproxy

go 1.25.0

require golang.org/x/mod v0.40.0
