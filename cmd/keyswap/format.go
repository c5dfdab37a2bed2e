package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// displayKey returns key as printed in tables and sweep listings: as is
// when it is printable text without spaces, Go-quoted otherwise, so that
// every key stays on one line and in one column. -json prints keys exactly.
func displayKey(key string) string {
	if !utf8.ValidString(key) || strings.IndexFunc(key, func(r rune) bool {
		return !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '"'
	}) >= 0 {
		return strconv.Quote(key)
	}
	return key
}

// fmtTTL formats a TTL in seconds as returned by the TTL command.
func fmtTTL(seconds int64) string {
	if seconds < 0 {
		return "none"
	}
	return fmtDuration(time.Duration(seconds) * time.Second)
}

// fmtAge formats the age of a temp key. A timestamp ahead of the clock
// (clock skew, or a name that is not ours) is "future".
func fmtAge(seconds int64) string {
	if seconds < 0 {
		return "future"
	}
	return fmtDuration(time.Duration(seconds) * time.Second)
}

// fmtDuration formats d briefly, to the second, in at most two units:
// "42s", "4m58s", "2h3m", "3d4h".
func fmtDuration(d time.Duration) string {
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%ds", s/60, s%60)
	case s < 48*3600:
		return fmt.Sprintf("%dh%dm", s/3600, s%3600/60)
	default:
		return fmt.Sprintf("%dd%dh", s/86400, s%86400/3600)
	}
}

// fmtBytes formats a byte count with binary units: "812 B", "70.4 KiB".
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[i])
}

// fmtInt formats n in decimal.
func fmtInt(n int64) string { return strconv.FormatInt(n, 10) }

// fmtOptional formats *p with f, or "-" when p is nil (unknown).
func fmtOptional(p *int64, f func(int64) string) string {
	if p == nil {
		return "-"
	}
	return f(*p)
}

// yesNo formats a boolean column.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// plural returns "1 key" or "n keys".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// prefix returns the first n bytes of s, or s when it is shorter.
func prefix(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// writeJSON writes v to w as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// shellSafe are the bytes that no shell treats specially.
const shellSafe = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@%"

// shellQuote returns s as a shell word: as is when it is made of shellSafe
// bytes; in single quotes when it is printable text; otherwise in bash's
// $'...', with \xHH for each byte that is not printable ASCII, so that the
// word stands for exactly s's bytes.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, shellSafe) == "" {
		return s
	}
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	var b strings.Builder
	b.WriteString("$'")
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= ' ' && c <= '~':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}
