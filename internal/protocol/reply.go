package protocol

import (
	"fmt"

	"github.com/redis/rueidis"
)

// reply is a script's array reply: a code, then integers or strings.
type reply []rueidis.RedisMessage

// parseReply reads a script's array reply.
func parseReply(res rueidis.RedisResult) (reply, error) {
	return res.ToArray()
}

// code returns the reply's first element.
func (r reply) code() (int64, error) {
	if len(r) == 0 {
		return 0, fmt.Errorf("empty script reply")
	}
	return r[0].AsInt64()
}

// int returns element i as an integer.
func (r reply) int(i int) (int64, error) {
	if i >= len(r) {
		return 0, fmt.Errorf("script reply %v has no element %d", r, i)
	}
	return r[i].AsInt64()
}

// str returns element i as a string.
func (r reply) str(i int) string {
	if i >= len(r) {
		return ""
	}
	s, _ := r[i].ToString()
	return s
}

// ints returns elements from..len(r) as integers.
func (r reply) ints(from int) ([]int64, error) {
	out := make([]int64, 0, max(0, len(r)-from))
	for i := from; i < len(r); i++ {
		n, err := r[i].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("script reply element %d: %w", i, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// refusal turns the {NO_RIGHT, cmd, key} and {UNKNOWN_CMD, cmd} replies into an error
// matching ErrNoPermission that names the command, or returns nil.
func (r reply) refusal() error {
	code, err := r.code()
	if err != nil {
		return nil
	}
	switch code {
	case codeNoRight:
		return fmt.Errorf("%w: this Redis user may not run %s on %q (grant it in the user's ACL rules)", ErrNoPermission, r.str(1), r.str(2))
	case codeUnknownCmd:
		return fmt.Errorf("%w: the server has no command %s (renamed or disabled with rename-command?)", ErrNoPermission, r.str(1))
	}
	return nil
}
