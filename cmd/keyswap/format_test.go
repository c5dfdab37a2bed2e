package main

import (
	"os/exec"
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{fmtDuration(0), "0s"},
		{fmtDuration(59 * time.Second), "59s"},
		{fmtDuration(time.Minute), "1m0s"},
		{fmtDuration(time.Hour - time.Second), "59m59s"},
		{fmtDuration(time.Hour), "1h0m"},
		{fmtDuration(47*time.Hour + 59*time.Minute), "47h59m"},
		{fmtDuration(48 * time.Hour), "2d0h"},
		{fmtTTL(-1), "none"},
		{fmtTTL(90), "1m30s"},
		{fmtAge(-1), "future"},
		{fmtBytes(0), "0 B"},
		{fmtBytes(1023), "1023 B"},
		{fmtBytes(1024), "1.0 KiB"},
		{fmtBytes(3 << 20), "3.0 MiB"},
		{fmtBytes(1 << 62), "4096.0 PiB"},
		{displayKey("users:by-email"), "users:by-email"},
		{displayKey("{users}:idx"), "{users}:idx"},
		{displayKey("a b"), `"a b"`},
		{displayKey("a\nb"), `"a\nb"`},
		{displayKey("\xff"), `"\xff"`},
		{displayKey(`say "hi"`), `"say \"hi\""`},
		{plural(0, "key"), "0 keys"},
		{plural(1, "key"), "1 key"},
		{prefix("0123456789", 8), "01234567"},
		{prefix("abc", 8), "abc"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestShellQuote quotes words and has bash read them back: each stands for
// exactly its bytes.
func TestShellQuote(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash is needed to read the quoted words back: %v", err)
	}
	for _, tc := range []struct{ word, want string }{
		{"users:by-email:rebuild:*", "'users:by-email:rebuild:*'"},
		{"plain-word_1.2/x:y@z%=+,", "plain-word_1.2/x:y@z%=+,"},
		{"", "''"},
		{"it's", `'it'\''s'`},
		{"{users:*}:rebuild:*", "'{users:*}:rebuild:*'"},
		{"a b $HOME `x` \"q\" !", "'a b $HOME `x` \"q\" !'"},
		{"ünï", "'ünï'"},
		{"bin\xff*", `$'bin\xff*'`},
		{"tab\there's \\", `$'tab\x09here\'s \\'`},
	} {
		got := shellQuote(tc.word)
		if got != tc.want {
			t.Errorf("shellQuote(%q): got %s, want %s", tc.word, got, tc.want)
		}
		out, err := exec.Command(bash, "-c", "printf %s "+got).Output()
		if err != nil {
			t.Fatalf("bash -c 'printf %%s %s': %v", got, err)
		}
		if string(out) != tc.word {
			t.Errorf("bash reads %s as %q, want %q", got, out, tc.word)
		}
	}
}
