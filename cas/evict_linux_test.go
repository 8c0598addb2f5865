package cas

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestPartialEvictsOldGroups checks a download's page-cache window: a
// flush drops the pages of the groups that the flush before it made
// durable, keeps those of its own and of later writes, loses nothing;
// the finished blob is dropped coolFor after it finished; nothing is
// dropped with Options.KeepDownloadCache.
func TestPartialEvictsOldGroups(t *testing.T) {
	for _, keep := range []bool{false, true} {
		fx := newFlushFixture(t, 31, 12*GroupSize)
		fx.dst.opt.KeepDownloadCache = keep
		p, err := fx.dst.OpenPartial(fx.c, fx.size)
		if err != nil {
			t.Fatal(err)
		}
		writeGroups := func(from, to int64) {
			for g := from; g < to; g++ {
				if err := fx.write(p, g); err != nil {
					t.Fatal(err)
				}
			}
		}
		writeGroups(0, 4)
		fx.tick()
		writeGroups(4, 5) // flush 1: groups 0-4 durable, nothing older
		writeGroups(5, 8)
		fx.tick()
		writeGroups(8, 9) // flush 2: groups 5-8 durable; 0-4 dropped
		writeGroups(9, 10)

		path := fx.dst.partialPath(fx.c, ".data")
		cached := cachedGroups(t, path, 10)
		for g, pages := range cached {
			if want := keep || g >= 5; want && pages != pagesPerGroup || !want && pages != 0 {
				t.Errorf("keep=%v: group %d has %d of %d pages cached, want cached=%v (pages: %v)", keep, g, pages, pagesPerGroup, want, cached)
			}
		}
		fx.finish(p, 10) // every byte still there, and the blob whole

		// The finished blob stays cached for coolFor, then a flush of
		// another download (dropCooled) drops it. (finish read the whole
		// blob back: every group is cached again now.)
		blob := fx.dst.blobPath(fx.c)
		fx.clock.Lock()
		fx.now = fx.now.Add(coolFor - time.Millisecond)
		fx.clock.Unlock()
		fx.dst.dropCooled(maxCooledPerFlush)
		if c := cachedGroups(t, blob, 12); c[0] != pagesPerGroup || c[11] != pagesPerGroup {
			t.Errorf("keep=%v: blob dropped before coolFor: %v", keep, c)
		}
		fx.clock.Lock()
		fx.now = fx.now.Add(time.Millisecond)
		fx.clock.Unlock()
		fx.dst.dropCooled(maxCooledPerFlush)
		for g, pages := range cachedGroups(t, blob, 12) {
			if keep && pages != pagesPerGroup || !keep && pages != 0 {
				t.Errorf("keep=%v: blob's group %d has %d pages cached after coolFor", keep, g, pages)
			}
		}
	}
}

// pagesPerGroup is how many pages a group spans.
var pagesPerGroup = int(GroupSize / int64(os.Getpagesize()))

// cachedGroups counts for each of the first n groups of the file at path
// how many of its pages are in the page cache (mincore(2)). A file system
// that keeps every page (tmpfs), or pages larger than a group, skip the
// test.
func cachedGroups(t *testing.T, path string, n int64) []int {
	t.Helper()
	if pagesPerGroup < 1 {
		t.Skipf("pages of %d bytes: a group is less than a page", os.Getpagesize())
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is on tmpfs, which keeps every page in memory", path)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, int(n*GroupSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, int(n)*pagesPerGroup)
	// x/sys of this module has no Mincore.
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	out := make([]int, n)
	for g := range out {
		for _, v := range vec[g*pagesPerGroup : (g+1)*pagesPerGroup] {
			out[g] += int(v & 1)
		}
	}
	return out
}
