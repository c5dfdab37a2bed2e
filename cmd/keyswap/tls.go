package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/redis/rueidis"
)

// tlsFlags are the TLS connection flags, named as redis-cli names them.
type tlsFlags struct {
	on       bool
	cacert   string
	cert     string
	key      string
	insecure bool
	sni      string
}

// add defines the TLS flags on fs.
func (f *tlsFlags) add(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "tls", false, "connect with TLS, as a rediss:// URL does")
	fs.StringVar(&f.cacert, "cacert", "", "PEM `file` of the CA certificates to verify the server's certificate with\n"+
		"(default: the system's)")
	fs.StringVar(&f.cert, "cert", "", "PEM `file` of the client certificate, for a server that asks for one\n"+
		"(tls-auth-clients); needs --key")
	fs.StringVar(&f.key, "key", "", "PEM `file` of the private key of --cert")
	fs.BoolVar(&f.insecure, "insecure", false, "do not verify the server's certificate")
	fs.StringVar(&f.sni, "sni", "", "server `name` to send in the TLS handshake and to verify the certificate against\n"+
		"(default: the host each server is reached at)")
}

// config returns the TLS configuration of a connection with the options
// parsed from the URLs, opt: nil when neither --tls nor a rediss:// URL asks
// for TLS. The errors name the flag at fault.
func (f *tlsFlags) config(opt rueidis.ClientOption) (*tls.Config, error) {
	fromURL := opt.TLSConfig // rediss://, maybe with ?skip_verify
	if !f.on && fromURL == nil {
		if name := f.given(); name != "" {
			return nil, fmt.Errorf("%s needs TLS: add --tls, or use a rediss:// URL", name)
		}
		return nil, nil
	}
	if opt.DialCtxFn != nil { // set by rueidis.ParseURL for unix:// only
		return nil, errors.New("TLS over a unix socket is not supported: drop --tls, or connect to the server's TLS port")
	}
	if (f.cert == "") != (f.key == "") {
		return nil, errors.New("--cert and --key go together: give both or neither")
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Empty unless --sni: then each server's certificate is verified
		// against the host it is dialled at, the seeds' and the cluster
		// nodes' found through them alike. (rueidis.ParseURL would verify
		// every node against the first URL's host.)
		ServerName:         f.sni,
		InsecureSkipVerify: f.insecure || fromURL != nil && fromURL.InsecureSkipVerify,
	}
	if f.cacert != "" {
		pem, err := os.ReadFile(f.cacert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--cacert %s: no PEM certificate in it", f.cacert)
		}
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("--cert %s, --key %s: %w", f.cert, f.key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// suggest returns the TLS flags given, for a command keyswap suggests.
func (f *tlsFlags) suggest() []string {
	var args []string
	if f.on {
		args = append(args, "--tls")
	}
	for _, kv := range [][2]string{{"--cacert", f.cacert}, {"--cert", f.cert}, {"--key", f.key}, {"--sni", f.sni}} {
		if kv[1] != "" {
			args = append(args, kv[0], shellQuote(kv[1]))
		}
	}
	if f.insecure {
		args = append(args, "--insecure")
	}
	return args
}

// given returns the name of the first TLS setting given besides --tls, or
// "" when none is.
func (f *tlsFlags) given() string {
	switch {
	case f.cacert != "":
		return "--cacert"
	case f.cert != "":
		return "--cert"
	case f.key != "":
		return "--key"
	case f.insecure:
		return "--insecure"
	case f.sni != "":
		return "--sni"
	}
	return ""
}

// tlsHint returns what to do about err, the error of a connection with
// TLS configuration cfg (nil: no TLS), when it is a TLS failure: a server
// certificate that cannot be verified, a server that spoke no TLS, or a
// server that refused the client's certificate or its lack of one.
func tlsHint(err error, cfg *tls.Config) (string, bool) {
	if cfg == nil {
		return "", false
	}
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		dial     *net.OpError
	)
	switch {
	case errors.As(err, &unknown):
		return "the server's certificate is not signed by a CA that keyswap trusts: pass the CA's certificate with --cacert, or skip the check with --insecure", true
	case errors.As(err, &hostname):
		return "the server's certificate is not for the name it was verified against: pass a name it holds with --sni", true
	case errors.As(err, &invalid):
		return "the server's certificate is not valid", true
	case errors.As(err, &record):
		return "the server did not answer in TLS: is this its TLS port?", true
	case errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &dial) && dial.Op == "dial"):
		// Connected, but no TLS answer: a plain port waits for the end of
		// a command line that never comes.
		return "the server did not answer the TLS handshake in time: is this its TLS port?", true
	case refusedClient(err):
		if len(cfg.Certificates) == 0 {
			return "the server ended the connection, as it does when it requires a client certificate: pass --cert and --key", true
		}
		return "the server ended the connection, as it does when it does not trust the client certificate: is --cert signed by a CA that the server trusts?", true
	}
	return "", false
}

// refusedClient reports whether err is how a TLS server refuses the client
// certificate it was given or not given. With TLS 1.3 it verifies it after
// the client's side of the handshake is done, then sends an alert and
// closes: the client sees the alert, or, when the close overtakes it, a
// reset or an end of file.
func refusedClient(err error) bool {
	return strings.Contains(err.Error(), "remote error: tls: ") || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
