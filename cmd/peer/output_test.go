package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"golang.org/x/sys/unix"
)

// addSmall stores data and returns its CID.
func addSmall(t *testing.T, home string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "in.bin")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return strings.Fields(mustRun(t, home, "add", "-q", p))[0]
}

// get -o never silently replaces what is at the path: an existing file
// needs --force (and keeps its mode), a symbolic link is written through,
// a directory is refused.
func TestGetOutputTargets(t *testing.T) {
	home := t.TempDir()
	data := []byte("the blob's bytes\n")
	cid := addSmall(t, home, data)
	dir := t.TempDir()

	t.Run("new file gets the umask's mode", func(t *testing.T) {
		old := unix.Umask(0o022)
		defer unix.Umask(old)
		p := filepath.Join(dir, "new.bin")
		mustRun(t, home, "get", cid, "-o", p)
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o644 {
			t.Fatalf("new file: %v, mode %v; want 0644", err, fi.Mode().Perm())
		}
	})
	t.Run("existing file needs --force and keeps its mode", func(t *testing.T) {
		p := filepath.Join(dir, "exists.txt")
		os.WriteFile(p, []byte("precious"), 0o640)
		os.Chmod(p, 0o640)
		if _, err := run(t, home, "get", cid, "-o", p); err == nil || !strings.Contains(err.Error(), "--force") {
			t.Fatalf("get onto an existing file: %v; want a refusal naming --force", err)
		}
		if got, _ := os.ReadFile(p); string(got) != "precious" {
			t.Fatalf("refused get changed the file: %q", got)
		}
		mustRun(t, home, "get", cid, "-o", p, "--force")
		fi, _ := os.Stat(p)
		if got, _ := os.ReadFile(p); !bytes.Equal(got, data) || fi.Mode().Perm() != 0o640 {
			t.Fatalf("get --force: %q mode %v; want the blob, mode 0640", got, fi.Mode().Perm())
		}
	})
	t.Run("symbolic link is followed, not replaced", func(t *testing.T) {
		real := filepath.Join(dir, "real.bin")
		link := filepath.Join(dir, "link.bin")
		os.Symlink(real, link)
		mustRun(t, home, "get", cid, "-o", link)
		fi, err := os.Lstat(link)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Fatalf("link after get: %v, mode %v; want still a symbolic link", err, fi.Mode())
		}
		if got, _ := os.ReadFile(real); !bytes.Equal(got, data) {
			t.Fatalf("link target holds %q; want the blob", got)
		}
		// The target now exists: writing through the link again is a
		// replacement and needs --force like any existing file.
		if _, err := run(t, home, "get", cid, "-o", link); err == nil {
			t.Fatal("get through a link onto an existing file succeeded without --force")
		}
	})
	t.Run("directory is refused", func(t *testing.T) {
		if _, err := run(t, home, "get", cid, "-o", dir, "--force"); err == nil || !strings.Contains(err.Error(), "directory") {
			t.Fatalf("get onto a directory: %v", err)
		}
	})
	t.Run("named pipe is written through", func(t *testing.T) {
		p := filepath.Join(dir, "pipe")
		if err := unix.Mkfifo(p, 0o600); err != nil {
			t.Skipf("mkfifo: %v", err)
		}
		got := make(chan []byte, 1)
		go func() {
			f, err := os.Open(p)
			if err != nil {
				got <- nil
				return
			}
			b, _ := io.ReadAll(f)
			f.Close()
			got <- b
		}()
		mustRun(t, home, "get", cid, "-o", p)
		select {
		case b := <-got:
			if !bytes.Equal(b, data) {
				t.Fatalf("reader of the pipe got %q", b)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("reader of the pipe got nothing")
		}
		if fi, _ := os.Lstat(p); fi.Mode()&fs.ModeNamedPipe == 0 {
			t.Fatalf("pipe replaced by a %v", fi.Mode())
		}
	})
	t.Run("character device is written through", func(t *testing.T) {
		// A private copy of /dev/null (major 1, minor 3): if get replaced
		// the device, only this node is lost, never the system's.
		p := filepath.Join(dir, "null")
		if err := unix.Mknod(p, syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Skipf("mknod needs root: %v", err)
		}
		mustRun(t, home, "get", cid, "-o", p)
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
			t.Fatalf("device after get: %v, mode %v; want still a character device", err, fi.Mode())
		}
	})
}

// add refuses what is not a regular file before opening it: a FIFO with
// no writer would block open(2) forever.
func TestAddRefusesFIFO(t *testing.T) {
	home := t.TempDir()
	p := filepath.Join(t.TempDir(), "pipe")
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := run(t, home, "add", p)
		errc <- err
	}()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "named pipe") {
			t.Fatalf("add of a FIFO: %v; want a refusal naming a named pipe", err)
		}
	case <-ctx.Done():
		// Unblock the stuck open so the goroutine can end.
		if f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("add of a FIFO blocked")
	}
}

// A get that must fetch opens its output first: an existing file without
// --force is refused before anything is fetched, and a fetch that fails
// leaves no temporary file behind.
func TestGetOutputBeforeFetch(t *testing.T) {
	home := t.TempDir()
	mustRun(t, home, "init")
	cid := cas.Sum([]byte("a blob nobody here has")).String()
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing")
	if err := os.WriteFile(existing, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	dead := "ws://127.0.0.1:1" // nothing listens: a fetch would fail on it
	if _, err := run(t, home, "get", cid, "-o", existing, "--signal", dead); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("get onto an existing file: %v; want the refusal naming --force, before any fetch", err)
	}
	if _, err := run(t, home, "get", cid, "-o", filepath.Join(dir, "new"), "--signal", dead); err == nil {
		t.Fatal("a get from a dead signaling server succeeded")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("the output directory holds %v; want only the existing file", names)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Fatalf("the existing file became %q", b)
	}
}

// The rename that ends a get onto a new path does not replace a file
// that appeared there meanwhile.
func TestRenameNoReplace(t *testing.T) {
	dir := t.TempDir()
	tmp, dst := filepath.Join(dir, "tmp"), filepath.Join(dir, "dst")
	os.WriteFile(tmp, []byte("new"), 0o644)
	os.WriteFile(dst, []byte("theirs"), 0o644)
	if err := renameNoReplace(tmp, dst); !errors.Is(err, errExists) {
		t.Fatalf("rename onto a file that appeared: %v; want errExists", err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "theirs" {
		t.Fatalf("the file that appeared became %q", b)
	}
	os.Remove(dst)
	if err := renameNoReplace(tmp, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "new" {
		t.Fatalf("renamed file holds %q", b)
	}
}
