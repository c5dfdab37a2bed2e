package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"time"
)

// respFile is a temp file of pre-generated RESP: what the limit method
// pipes into redis-cli.
type respFile struct {
	path     string
	commands int // commands in the file: the replies redis-cli must count
}

// writeRESP writes the commands of w for d to a new temp file, perCommand
// entries per command, as redis-cli --pipe's documented mass insertion
// wants them. The caller removes the file.
func writeRESP(w workload, d dataset) (_ respFile, err error) {
	f, err := os.CreateTemp("", "keyswap-bench-*.resp")
	if err != nil {
		return respFile{}, err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	out := respFile{path: f.Name()}
	var num []byte
	writeBulk := func(s string) {
		num = strconv.AppendInt(append(num[:0], '$'), int64(len(s)), 10)
		bw.Write(num)
		bw.WriteString("\r\n")
		bw.WriteString(s)
		bw.WriteString("\r\n")
	}
	err = w.commands(d, perCommand, func(name, key string, args []string, _ int) error {
		num = strconv.AppendInt(append(num[:0], '*'), int64(2+len(args)), 10)
		bw.Write(num)
		bw.WriteString("\r\n")
		writeBulk(name)
		writeBulk(key)
		for _, a := range args {
			writeBulk(a)
		}
		out.commands++
		return nil
	})
	if err != nil {
		return respFile{}, err
	}
	if err := bw.Flush(); err != nil {
		return respFile{}, err
	}
	return out, nil
}

// pipeSummary is redis-cli --pipe's last line: "errors: 0, replies: 1000".
var pipeSummary = regexp.MustCompile(`errors: (\d+), replies: (\d+)`)

// runLimit pipes f into redis-cli --pipe against s, and returns what
// redis-cli used. Any error reply, or a reply count other than f's command
// count, is an error.
func runLimit(ctx context.Context, cli string, s *server, f respFile) (*child, error) {
	in, err := os.Open(f.path)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	cmd := exec.CommandContext(ctx, cli, "-h", s.host, "-p", s.port, "--pipe")
	cmd.Stdin = in
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if err != nil {
		return nil, fmt.Errorf("%s --pipe: %w\n%s", cli, err, out.Bytes())
	}
	m := pipeSummary.FindSubmatch(out.Bytes())
	if m == nil {
		return nil, fmt.Errorf("%s --pipe: no summary in its output:\n%s", cli, out.Bytes())
	}
	if string(m[1]) != "0" || string(m[2]) != strconv.Itoa(f.commands) {
		return nil, fmt.Errorf("%s --pipe: %s, want errors: 0, replies: %d", cli, m[0], f.commands)
	}
	ch := &child{cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		ch.maxRSS = uint64(ru.Maxrss) * 1024 // kilobytes on Linux
	}
	return ch, nil
}

// cliVersion returns redis-cli's version line, or "" when it cannot run.
func cliVersion(ctx context.Context, cli string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, "--version").Output()
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(out))
}
