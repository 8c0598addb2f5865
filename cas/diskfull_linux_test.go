//go:build linux

package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A full disk during add fails that add with ENOSPC, leaves no temporary
// file, and loses nothing already stored. The test mounts an 8 MiB tmpfs in
// a private mount namespace, so it needs root; it is skipped otherwise.
func TestDiskFullDuringAdd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private tmpfs mount")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), diskFullChildEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "SKIP:") {
		t.Skip(string(out))
	}
	if err != nil || !strings.Contains(string(out), "ok\n") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(string(out)))
}

func diskFullChild(dir string) error {
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
		fmt.Println("SKIP: cannot mount tmpfs:", err)
		return nil
	}
	s, err := Open(dir, Options{})
	if err != nil {
		return err
	}
	ctx := context.Background()
	a := randData(1, 1<<20)
	infA, err := s.Put(ctx, bytes.NewReader(a))
	if err != nil {
		return fmt.Errorf("first put: %w", err)
	}
	_, err = s.Put(ctx, bytes.NewReader(randData(2, 16<<20)))
	if !errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("put on a full disk: %v; want ENOSPC", err)
	}
	fmt.Println("full disk error:", err)
	if ents, _ := os.ReadDir(filepath.Join(dir, dirTmp)); len(ents) != 0 {
		return fmt.Errorf("temporary files left: %v", ents)
	}
	back := make([]byte, len(a))
	if _, err := s.ReadAt(infA.CID, back, 0); err != nil || !bytes.Equal(back, a) {
		return fmt.Errorf("blob stored before the full disk: %v", err)
	}
	if _, err := s.Put(ctx, bytes.NewReader(randData(3, 1<<20))); err != nil {
		return fmt.Errorf("put after the failure: %w", err)
	}
	if err := s.Close(); err != nil {
		return err
	}
	fmt.Println("ok")
	return nil
}
