package hostcalls

import (
	"context"
	"io"
	"io/fs"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// ListPage answers one page of dir_list or file_list (abi.ListRequest) over
// the pool folder open as dirfd: the names of the entries of type typ
// (fs.ModeDir, or 0 for regular files) that valid accepts, in byte order,
// after req.After, at most the request's bounded limit of them. The folder
// is read through a descriptor of its own (openat "." beneath dirfd), so
// nothing outside it is named and concurrent listings do not share a
// position. Symlinks are never followed: a symlink is neither a directory
// nor a file here.
func ListPage(ctx context.Context, dirfd int, req *abi.ListRequest, typ fs.FileMode, valid func(string) error) (*abi.ListPage, error) {
	limit := int(req.Limit)
	switch {
	case limit < 0:
		return nil, abi.Errorf(abi.InvalidArgument, "list: negative limit %d", req.Limit)
	case limit == 0:
		limit = abi.ListPageDefault
	case limit > abi.ListPageMax:
		limit = abi.ListPageMax
	}
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, abi.Errorf(abi.Internal, "list: open pool folder: %v", err)
	}
	dir := os.NewFile(uintptr(fd), "pool")
	defer dir.Close()
	// Keep only the limit+1 smallest names after After: memory stays
	// bounded by the page, whatever the size of the pool.
	var names []string
	for {
		if err := ctx.Err(); err != nil {
			code := abi.Canceled
			if err == context.DeadlineExceeded {
				code = abi.DeadlineExceeded
			}
			return nil, abi.Errorf(code, "list: %v", err)
		}
		ents, err := dir.ReadDir(512)
		for _, e := range ents {
			name := e.Name()
			if name <= req.After || valid(name) != nil || e.Type()&fs.ModeType != typ {
				continue
			}
			if len(names) > limit && name >= names[limit] {
				continue
			}
			i, _ := slices.BinarySearch(names, name)
			names = slices.Insert(names, i, name)
			if len(names) > limit+1 {
				names = names[:limit+1]
			}
		}
		if err == io.EOF || (err == nil && len(ents) == 0) {
			break
		} else if err != nil {
			return nil, abi.Errorf(abi.Internal, "list: read pool folder: %v", err)
		}
	}
	page := &abi.ListPage{Names: names}
	if len(names) > limit {
		page.Names = names[:limit]
		page.Next = names[limit-1]
	}
	return page, nil
}
