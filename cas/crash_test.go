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
	"syscall"
	"testing"
	"time"

	"github.com/rdrr/peer/cas/bao"
)

// crashChildEnv switches the test binary into the child role of
// TestCrashKill: it adds blobs and downloads partials until killed.
const crashChildEnv = "RDRR_CAS_CRASH_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	if dir := os.Getenv(diskFullChildEnv); dir != "" {
		if err := diskFullChild(dir); err != nil {
			fmt.Println("FAIL:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

func crashChild(dir string) {
	seed, _ := strconv.ParseUint(os.Getenv("RDRR_CAS_CRASH_SEED"), 10, 64)
	r := rand.New(rand.NewPCG(seed, 77))
	s, err := Open(dir, Options{})
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
	for i := 0; ; i++ {
		size := r.Int64N(3 << 20)
		data := randData(seed*1000+uint64(i), size)
		switch i % 3 {
		case 0, 1:
			if _, err := s.Put(ctx, bytes.NewReader(data)); err != nil {
				fmt.Println("put:", err)
				os.Exit(2)
			}
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
				p.Finish(ctx)
			} else {
				p.Close()
			}
		}
	}
}

// A child process adding blobs is killed with SIGKILL at random moments;
// after each kill the store opens, every indexed blob re-hashes to its CID,
// every group a partial download claims verifies, and no temporary file is
// left.
func TestCrashKill(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(99, 1))
	const kills = 32
	var blobs, groups int
	for i := range kills {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, "RDRR_CAS_CRASH_SEED="+strconv.Itoa(i))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		if line != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("kill %d: child said %q", i, line)
		}
		go io.Copy(io.Discard, out)
		time.Sleep(time.Duration(r.IntN(400)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("kill %d: child exited on its own: %v", i, err)
		}
		b, g := checkStore(t, dir)
		blobs, groups = b, groups+g
	}
	t.Logf("%d kills; %d blobs indexed at the end; %d partial groups checked", kills, blobs, groups)
	if blobs < kills {
		t.Errorf("only %d blobs survived %d runs: the child is not adding", blobs, kills)
	}
}

// checkStore opens the store at dir and verifies everything it claims.
func checkStore(t *testing.T, dir string) (blobs, groups int) {
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
		if int64(len(b)) != inf.Size || Sum(b) != inf.CID {
			return fmt.Errorf("indexed blob %s does not hash to its CID", inf.CID)
		}
		ob, err := os.ReadFile(s.outboardPath(inf.CID))
		if err != nil {
			return err
		}
		return bao.VerifyTree([32]byte(inf.CID), ob, inf.Size)
	})
	if err != nil {
		t.Fatal(err)
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
			if err := bao.VerifyCover([32]byte(c), p.ob, data[off:off+n], size, off, n, &scratch); err != nil {
				t.Fatalf("partial %s claims group %d, which does not verify: %v", c, g, err)
			}
			groups++
		}
		p.Close()
	}
	return blobs, groups
}
