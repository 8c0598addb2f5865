package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Browser tests drive Debian's chromium, headless, through chromedp. The
// page is the browser peer the daemon serves at /app/, built into the peer
// binary (make build; the tests build it when it is missing).
//
// They run in a network namespace of their own (privateNet): chromium
// gathers no candidate on loopback (with --allow-loopback-in-peer-connection
// it only answers checks there), so two pages can meet only on an interface
// with an address and a route. The namespace has one, a veth pair that
// leads nowhere (10.200.0.1, default route to nothing), besides lo; native
// peers keep to 127.0.0.1 as on any machine. Nothing leaves the namespace.

// chromiumFlags are what loopback WebRTC needs (both; see
// ../shared/deps/README.md) and a root user without a sandbox.
func chromiumFlags() []chromedp.ExecAllocatorOption {
	return append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.Flag("headless", "new"),
		chromedp.NoSandbox,
		chromedp.Flag("allow-loopback-in-peer-connection", true),
		chromedp.Flag("disable-features", "WebRtcHideLocalIpsWithMdns"),
		chromedp.Flag("enable-unsafe-webgpu", true),
		chromedp.WindowSize(1100, 900),
	)
}

// chromium returns the browser's path, installing Debian's package when it
// is missing and this user can; it skips the test only when it cannot be
// had.
func chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	var out []byte
	err := fmt.Errorf("not root")
	if os.Geteuid() == 0 {
		out, err = exec.Command("apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium").CombinedOutput()
		if p, lerr := exec.LookPath("chromium"); err == nil && lerr == nil {
			return p
		}
	}
	t.Skipf("browser tests need chromium, which is not installed and could not be (`make deps` installs it): %v %s", err, out)
	return ""
}

// newBrowser starts a headless chromium for the test; its tabs are made
// with newTab.
func newBrowser(t testing.TB) context.Context {
	t.Helper()
	path := chromium(t)
	opts := append(chromiumFlags(), chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(bcancel)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// page is one tab.
type page struct {
	t   testing.TB
	ctx context.Context
}

// newTab opens url in a new tab of the browser and waits for the peer in
// it to sign in.
func newTab(t testing.TB, bctx context.Context, url string) *page {
	t.Helper()
	ctx, cancel := chromedp.NewContext(bctx, chromedp.WithListener(func(ev any) { logConsole(t, ev) }))
	t.Cleanup(cancel)
	p := &page{t: t, ctx: ctx}
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	p.waitStarted()
	return p
}

func (p *page) waitStarted() {
	p.t.Helper()
	var st struct{ ID string }
	p.eval(`rdrrApp.started`, &st, 60*time.Second)
	if !strings.HasPrefix(st.ID, "12D3KooW") {
		p.t.Fatalf("page started as %q", st.ID)
	}
}

// eval runs expr in the page, awaiting a promise, into out (JSON).
func (p *page) eval(expr string, out any, timeout time.Duration) {
	p.t.Helper()
	if err := p.try(expr, out, timeout); err != nil {
		p.t.Fatalf("page: %s: %v", expr, err)
	}
}

func (p *page) try(expr string, out any, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		return err
	}
	if out != nil && len(raw) > 0 {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// screenshot saves the page as a PNG for a person to look at, under
// $RDRR_SCREENSHOTS or the system's temporary directory.
func (p *page) screenshot(name string) {
	p.t.Helper()
	dir := os.Getenv("RDRR_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "rdrr-screenshots")
	}
	p.try(`window.rdrrApp && rdrrApp.refresh ? rdrrApp.refresh() : null`, nil, 5*time.Second) // draw the latest
	png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Logf("screenshot: %v", err)
		return
	}
	os.MkdirAll(dir, 0o755)
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Logf("screenshot: %v", err)
		return
	}
	p.t.Logf("screenshot of the page: %s", path)
}

// stats is what rdrrPeer.stats() returns.
type pageStats struct {
	ID     string `json:"id"`
	Online bool   `json:"online"`
	// CertCheck: how the page's links check the peer's certificate.
	CertCheck string `json:"cert_check"`
	Fetched   int64  `json:"fetched"`
	Served    int64  `json:"served"`
	Bad       int64  `json:"bad_slices"`
	Bans      int64  `json:"bans"`
	Used      int64  `json:"used"`
	Blobs     []struct {
		CID      string `json:"cid"`
		Size     int64  `json:"size"`
		Verified int64  `json:"verified"`
		Whole    bool   `json:"whole"`
	} `json:"blobs"`
	Peers []struct {
		ID  string `json:"id"`
		In  int64  `json:"in"`
		Out int64  `json:"out"`
	} `json:"peers"`
	Events []struct {
		Peer string `json:"peer"`
		Kind string `json:"kind"`
		CID  string `json:"cid"`
		Off  int64  `json:"off"`
		Len  int64  `json:"len"`
	} `json:"events"`
	Banned []string `json:"banned"`
}

func (p *page) stats() pageStats {
	p.t.Helper()
	var s pageStats
	p.eval(`rdrrPeer.stats()`, &s, 10*time.Second)
	return s
}

// fetchResult is what rdrrApp.fetch resolves to.
type fetchResult struct {
	CID     string `json:"cid"`
	Size    int64  `json:"size"`
	MS      int64  `json:"ms"`
	Fetched int64  `json:"fetched"`
	Hash    string `json:"hash"`
	// Steady is the MB/s from the first verified piece to the last.
	Steady float64 `json:"steady_mbps"`
}

func (p *page) fetch(cid string, timeout time.Duration) fetchResult {
	p.t.Helper()
	var r fetchResult
	p.eval(fmt.Sprintf(`rdrrApp.fetch(%q)`, cid), &r, timeout)
	return r
}

// logConsole logs what the page prints (the Go peer's log goes to the
// console) and what it throws.
func logConsole(t testing.TB, ev any) {
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		var parts []string
		for _, a := range ev.Args {
			if a.Value != nil {
				var s string
				if json.Unmarshal(a.Value, &s) == nil {
					parts = append(parts, s)
					continue
				}
				parts = append(parts, string(a.Value))
			} else {
				parts = append(parts, a.Description)
			}
		}
		t.Logf("page console.%s: %s", ev.Type, strings.Join(parts, " "))
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		desc := d.Text
		if d.Exception != nil {
			desc += " " + d.Exception.Description
		}
		t.Logf("page exception: %s", desc)
	}
}

// envPrivateNet marks a test process running in its private namespace.
const envPrivateNet = "RDRR_PRIVATE_NET"

// privateNetSetup makes the namespace's network: lo, and a veth pair with
// an address and a default route that go nowhere.
const privateNetSetup = `ip link set lo up &&
ip link add rdrr0 type veth peer name rdrr1 &&
ip addr add 10.200.0.1/24 dev rdrr0 &&
ip link set rdrr0 up && ip link set rdrr1 up &&
ip route add default via 10.200.0.2 dev rdrr0 &&
exec "$@"`

// inPrivateNet reports whether this process is the test's run in its
// private network namespace. If not, it runs test (this binary, -test.run
// of the test's name) in a fresh namespace with the environment env, logs
// its output, passes its verdict on (failure, or a skip) and returns
// false: the caller returns. Without namespaces (no unshare, not root and
// no user namespaces) it reports false after skipping the test.
func inPrivateNet(t testing.TB, env ...string) bool {
	t.Helper()
	if os.Getenv(envPrivateNet) == "1" {
		return true
	}
	args := []string{"-n"}
	if os.Geteuid() != 0 {
		args = []string{"-r", "-n"} // a user namespace maps us to root in it
	}
	if err := exec.Command("unshare", append(args, "true")...).Run(); err != nil {
		t.Skipf("browser tests need a private network namespace (unshare %s): %v", strings.Join(args, " "), err)
	}
	timeout := "15m"
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); !ok {
	} else if d, ok := dt.Deadline(); ok {
		timeout = time.Until(d).Round(time.Second).String()
	}
	run := "^" + t.Name() + "$"
	if f := flag.Lookup("test.run"); f != nil && strings.HasPrefix(f.Value.String(), run) {
		run = f.Value.String() // the parent's selection of subtests
	}
	sel := []string{"-test.run=" + run}
	if _, ok := t.(*testing.B); ok {
		sel = []string{"-test.run=^$", "-test.bench=^" + t.Name() + "$", "-test.benchtime=1x"}
	}
	args = append(append(args, "--", "sh", "-c", privateNetSetup, "sh", os.Args[0]), sel...)
	args = append(args, "-test.v", "-test.count=1", "-test.timeout="+timeout)
	cmd := exec.Command("unshare", args...)
	cmd.Env = append(append(os.Environ(), envPrivateNet+"=1"), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	skipped := false
	for sc.Scan() {
		line := sc.Text()
		if b, ok := t.(*testing.B); ok {
			reportMetrics(b, line)
		}
		if strings.HasPrefix(strings.TrimSpace(line), "--- SKIP: "+t.Name()+" ") {
			skipped = true
		}
		t.Log(line)
	}
	err = cmd.Wait()
	switch {
	case err != nil:
		t.Fatalf("in its network namespace: %v", err)
	case skipped:
		t.Skip("skipped in its network namespace (see above)")
	}
	return false
}

// reportMetrics reports again the custom metrics of a benchmark result
// line of the child ("BenchmarkX 1 123 ns/op 0.95 x-of-raw-channel").
func reportMetrics(b *testing.B, line string) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
		return
	}
	for i := 2; i+1 < len(f); i += 2 {
		if v, err := strconv.ParseFloat(f[i], 64); err == nil && f[i+1] != "ns/op" {
			b.ReportMetric(v, f[i+1])
		}
	}
}
