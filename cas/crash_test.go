package cas

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdrr/peer/cas/bao"
)

// Environment of TestCrashKill and its child.
const (
	// crashSeedEnv overrides the test's random seed (it is logged).
	crashSeedEnv = "RDRR_CAS_CRASH_SEED"
	// crashChildSeedEnv seeds one child's work.
	crashChildSeedEnv = "RDRR_CAS_CRASH_CHILD_SEED"
	// crashModeEnv is the child's role: "add" or "recover".
	crashModeEnv = "RDRR_CAS_CRASH_MODE"
)

// crashChild is the child of TestCrashKill. In "add" mode it adds blobs
// and downloads partials until killed, printing "write I" halfway through
// reading blob I, "rename I" as a blob file is renamed into place, and
// "done I CID" once the call that stores it returned. In "recover" mode it
// opens the store, printing "adopt PATH" as recovery indexes each blob file
// the index did not name, and "opened" when Open returned. After "write",
// "rename" and "adopt" it pauses, so a kill on them lands in that step.
func crashChild(dir string) {
	seed, _ := strconv.ParseUint(os.Getenv(crashChildSeedEnv), 10, 64)
	fs := osFileOps()
	rename := fs.rename
	var cur atomic.Int64
	blobs := filepath.Join(dir, dirBlobs)
	fs.rename = func(oldpath, newpath string) error {
		if strings.HasPrefix(newpath, blobs) {
			markPause(fmt.Sprintf("rename %d\n", cur.Load()))
		}
		return rename(oldpath, newpath)
	}
	fs.syncFile = func(f *os.File) error {
		if strings.HasPrefix(f.Name(), blobs) { // only adoption syncs a file in place
			markPause(fmt.Sprintf("adopt %s\n", f.Name()))
		}
		return f.Sync()
	}
	if os.Getenv(crashModeEnv) == "recover" {
		s, err := open(dir, Options{}, fs)
		if err != nil {
			fmt.Println("open:", err)
			os.Exit(2)
		}
		fmt.Println("opened")
		s.Close()
		time.Sleep(time.Hour) // until killed
	}
	r := rand.New(rand.NewPCG(seed, 77))
	s, err := open(dir, Options{}, fs)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	src, err := Open(filepath.Join(dir, "src"), Options{NoSync: true})
	if err != nil {
		fmt.Println("open src:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	ctx := context.Background()
	for i := int64(0); ; i++ {
		cur.Store(i)
		size := r.Int64N(3 << 20)
		data := randData(seed^uint64(i)<<40, size)
		switch i % 3 {
		case 0, 1:
			inf, err := s.Put(ctx, &markReader{r: bytes.NewReader(data), at: size / 2, mark: fmt.Sprintf("write %d\n", i)})
			if err != nil {
				fmt.Println("put:", err)
				os.Exit(2)
			}
			fmt.Printf("done %d %s\n", i, inf.CID)
		case 2: // a download in slices, left unfinished half the time
			inf, _ := src.Put(ctx, bytes.NewReader(data))
			p, err := s.OpenPartial(inf.CID, size)
			if err != nil {
				fmt.Println("partial:", err)
				os.Exit(2)
			}
			for off := int64(0); off < size; off += 256 << 10 {
				n := min(256<<10, size-off)
				slice, _ := src.AppendSlice(nil, inf.CID, off, n)
				if err := p.WriteSlice(off, n, slice); err != nil {
					fmt.Println("write slice:", err)
					os.Exit(2)
				}
				if r.IntN(4) == 0 {
					p.mu.Lock()
					p.flushLocked()
					p.mu.Unlock()
				}
			}
			if r.IntN(2) == 0 {
				if inf, err := p.Finish(ctx); err == nil {
					fmt.Printf("done %d %s\n", i, inf.CID)
				}
			} else {
				p.Close()
			}
		}
	}
}

// markPause prints a progress marker, then gives the parent, which may
// kill on it, time to: a kill meant for the middle of a step lands there
// however loaded the machine is.
func markPause(mark string) {
	fmt.Print(mark)
	time.Sleep(50 * time.Millisecond)
}

// markReader calls markPause once at bytes of the stream have been read.
type markReader struct {
	r    io.Reader
	at   int64
	n    int64
	mark string
}

func (m *markReader) Read(p []byte) (int, error) {
	n, err := m.r.Read(p)
	if m.n < m.at && m.n+int64(n) >= m.at {
		markPause(m.mark)
	}
	m.n += int64(n)
	return n, err
}

// crashRun is one child started by TestCrashKill.
type crashRun struct {
	cmd   *exec.Cmd
	lines chan string
	seen  []string
}

func startCrashChild(t *testing.T, dir, mode string, seed uint64) *crashRun {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashModeEnv+"="+mode, crashChildSeedEnv+"="+strconv.FormatUint(seed, 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	run := &crashRun{cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		defer close(run.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			run.lines <- sc.Text()
		}
	}()
	return run
}

// until reads lines until one starts with prefix; false if the child
// ended or said "opened" (after which it says nothing more).
func (r *crashRun) until(prefix string) bool {
	for l := range r.lines {
		r.seen = append(r.seen, l)
		if strings.HasPrefix(l, prefix) {
			return true
		}
		if l == "opened" {
			return false
		}
	}
	return false
}

// kill kills the child with SIGKILL and reads what it said before dying.
func (r *crashRun) kill(t *testing.T) {
	t.Helper()
	r.cmd.Process.Kill() // SIGKILL where there are signals
	r.cmd.Wait()
	for l := range r.lines {
		r.seen = append(r.seen, l)
	}
	if !r.cmd.ProcessState.Exited() && r.cmd.ProcessState.ExitCode() == -1 {
		return // killed
	}
	t.Fatalf("child exited on its own (%v); it said %q", r.cmd.ProcessState, r.seen)
}

// A child process adding blobs is killed with SIGKILL at random moments,
// some on purpose in the middle of a write (after it read half of a blob,
// or as it renames one into place), and a child opening a store with
// leftovers (temporary files, blob files the index does not name, one of
// them corrupt) is killed during Open's recovery. After each kill the
// store opens, every indexed blob re-hashes to its CID, every group a
// partial download claims verifies, no temporary file is left, every blob
// whose Put or Finish returned is there, and every whole blob file left
// unindexed was indexed. The seed is logged; RDRR_CAS_CRASH_SEED repeats
// a run.
func TestCrashKill(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(crashSeedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", crashSeedEnv, v, err)
		}
	}
	t.Logf("seed %d (%s=%d repeats this run)", seed, crashSeedEnv, seed)
	r := rand.New(rand.NewPCG(seed, 1))
	adds, recovers := 24, 8
	if testing.Short() {
		adds, recovers = 6, 3
	}
	dir := t.TempDir()
	stored := map[CID]bool{} // every blob a Put or Finish returned
	var added, midWrite, midRecovery, blobs, groups int
	check := func(run *crashRun, planted []CID) {
		for _, l := range run.seen {
			var i int
			var cs string
			if _, err := fmt.Sscanf(l, "done %d %s", &i, &cs); err == nil {
				c, err := ParseCID(cs)
				if err != nil {
					t.Fatalf("child said %q: %v", l, err)
				}
				stored[c] = true
			}
		}
		b, g := checkStore(t, dir, stored, planted)
		blobs, groups = b, groups+g
	}
	every := (adds + recovers) / recovers
	for k := range adds + recovers {
		if k%every == every-1 {
			planted := plantLeftovers(t, dir, r)
			run := startCrashChild(t, dir, "recover", r.Uint64())
			// Kill at the n-th blob file adopted, or at a random moment.
			if r.IntN(4) > 0 {
				for range 1 + r.IntN(len(planted)) {
					run.until("adopt ")
				}
			} else {
				time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
			}
			run.kill(t)
			if !slicesContains(run.seen, "opened") {
				midRecovery++
			}
			check(run, planted)
			continue
		}
		run := startCrashChild(t, dir, "add", r.Uint64())
		if !run.until("ready") {
			run.kill(t)
			t.Fatalf("kill %d: child did not start: %q", k, run.seen)
		}
		switch added++; added % 4 {
		case 0: // a random moment
			time.Sleep(time.Duration(r.IntN(300)) * time.Millisecond)
		case 1: // halfway through reading a blob, after a few
			for range 1 + r.IntN(4) {
				run.until("write ")
			}
		case 2: // as a blob file is renamed into place
			for range 1 + r.IntN(4) {
				run.until("rename ")
			}
		case 3: // just after a Put or Finish returned
			for range 1 + r.IntN(3) {
				run.until("done ")
			}
		}
		run.kill(t)
		if inWrite(run.seen) {
			midWrite++
		}
		check(run, nil)
	}
	t.Logf("%d kills while adding (%d in the middle of a write), %d during recovery (%d before Open returned); %d blobs indexed at the end, %d returned by Put or Finish; %d partial groups checked",
		adds, midWrite, recovers, midRecovery, blobs, len(stored), groups)
	if midWrite == 0 {
		t.Errorf("no kill landed in the middle of a write")
	}
	if midRecovery == 0 {
		t.Errorf("no kill landed during Open's recovery")
	}
	if len(stored) == 0 {
		t.Errorf("no Put or Finish returned in %d runs: the child is not adding", adds)
	}
}

func slicesContains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

// inWrite reports whether the child's last blob was begun (written halfway
// or renamed) and not done.
func inWrite(lines []string) bool {
	for i := len(lines) - 1; i >= 0; i-- {
		switch f := append(strings.Fields(lines[i]), ""); f[0] {
		case "done":
			return false
		case "write", "rename":
			return true
		}
	}
	return false
}

// plantLeftovers leaves what crashes and a lost index leave for Open to
// recover: temporary files, whole blob files that the index does not name
// (returned), and one that does not hash to its name.
func plantLeftovers(t *testing.T, dir string, r *rand.Rand) []CID {
	t.Helper()
	for i := range 3 {
		os.WriteFile(filepath.Join(dir, dirTmp, fmt.Sprintf("put-left%d", i)), randData(r.Uint64(), 100_000), 0o644)
	}
	var planted []CID
	for range 3 {
		data := randData(r.Uint64(), 2<<20+r.Int64N(2<<20))
		c := Sum(data)
		path := filepath.Join(dir, dirBlobs, c.Hex()[:2], c.Hex())
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		planted = append(planted, c)
	}
	bad := Sum([]byte("not these bytes"))
	path := filepath.Join(dir, dirBlobs, bad.Hex()[:2], bad.Hex())
	os.MkdirAll(filepath.Dir(path), 0o755)
	os.WriteFile(path, randData(r.Uint64(), 1<<20), 0o644)
	return planted
}

// checkStore opens the store at dir and verifies everything it claims,
// and that every blob in stored and planted is there.
func checkStore(t *testing.T, dir string, stored map[CID]bool, planted []CID) (blobs, groups int) {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("open after kill: %v", err)
	}
	defer s.Close()
	if ents, _ := os.ReadDir(filepath.Join(dir, dirTmp)); len(ents) != 0 {
		t.Fatalf("temporary files left after open: %v", ents)
	}
	err = s.List(func(inf Info) error {
		blobs++
		b, err := os.ReadFile(s.blobPath(inf.CID))
		if err != nil {
			return err
		}
		if int64(len(b)) != inf.Size || Sum(b).Digest() != inf.CID.Digest() {
			return fmt.Errorf("indexed blob %s does not hash to its CID", inf.CID)
		}
		ob, err := os.ReadFile(s.outboardPath(inf.CID))
		if err != nil {
			return err
		}
		return bao.VerifyTree(inf.CID.Digest(), ob, inf.Size)
	})
	if err != nil {
		t.Fatal(err)
	}
	for c := range stored {
		if !s.Has(c) {
			t.Fatalf("%s was stored (Put or Finish returned), and is gone after a crash", c)
		}
	}
	for _, c := range planted {
		if !s.Has(c) {
			t.Fatalf("whole blob file %s, not indexed before a crash during recovery, is gone", c)
		}
	}
	parts, _ := s.Partials()
	for c, size := range parts {
		p, err := s.OpenPartial(c, size)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(s.partialPath(c, ".data"))
		var scratch [bao.GroupSize]byte
		for g := int64(0); g < bao.Groups(size); g++ {
			if !p.hasGroup(g) {
				continue
			}
			off, n := g*GroupSize, min(GroupSize, size-g*GroupSize)
			if int64(len(data)) < off+n {
				t.Fatalf("partial %s claims group %d beyond its data file", c, g)
			}
			if err := bao.VerifyCover(c.Digest(), p.ob, data[off:off+n], size, off, n, &scratch); err != nil {
				t.Fatalf("partial %s claims group %d, which does not verify: %v", c, g, err)
			}
			groups++
		}
		p.Close()
	}
	return blobs, groups
}
