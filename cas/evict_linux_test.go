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
		for g, in := range cached {
			want := keep || g >= 5
			if in != want {
				t.Errorf("keep=%v: group %d cached=%v, want %v (cached: %v)", keep, g, in, want, cached)
			}
		}
		fx.finish(p, 10) // every byte still there, and the blob whole

		// The finished blob stays cached for coolFor, then a flush of
		// another download (dropCooled) drops it.
		blob := fx.dst.blobPath(fx.c)
		fx.clock.Lock()
		fx.now = fx.now.Add(coolFor - time.Millisecond)
		fx.clock.Unlock()
		fx.dst.dropCooled()
		if c := cachedGroups(t, blob, 12); !c[0] || !c[11] {
			t.Errorf("keep=%v: blob dropped before coolFor: %v", keep, c)
		}
		fx.clock.Lock()
		fx.now = fx.now.Add(time.Millisecond)
		fx.clock.Unlock()
		fx.dst.dropCooled()
		for g, in := range cachedGroups(t, blob, 12) {
			if in != keep {
				t.Errorf("keep=%v: blob's group %d cached=%v after coolFor", keep, g, in)
			}
		}
	}
}

// cachedGroups reports for each of the first n groups of the file at path
// whether all its pages are in the page cache (mincore(2)). A file system
// that keeps every page (tmpfs) skips the test.
func cachedGroups(t *testing.T, path string, n int64) []bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		t.Skip("tmpfs keeps every page in memory")
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
	page := int64(os.Getpagesize())
	vec := make([]byte, n*GroupSize/page)
	// x/sys of this module has no Mincore.
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	per := GroupSize / page
	out := make([]bool, n)
	for g := range out {
		out[g] = true
		for _, v := range vec[int64(g)*per : int64(g+1)*per] {
			out[g] = out[g] && v&1 != 0
		}
	}
	return out
}
