package node

import (
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/hostcalls/fs"
	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
)

// WritePause returns what pauses the writes to the staged device dev of
// volume (mounted at stagingPath unless block): a device-mapper device
// itself, whose suspend flushes it and freezes a filesystem on it, or else
// the filesystem mounted from it. nil when neither can: a raw block
// device other than device-mapper.
func (n *Node) WritePause(dev, stagingPath string, block bool, volume string) (*quiesce.Target, error) {
	name, mapped, err := dm.DeviceName(dev)
	if err != nil {
		return nil, err
	}
	if mapped {
		return &quiesce.Target{Kind: quiesce.Mapped, Name: name, Volume: volume}, nil
	}
	if block {
		return nil, nil
	}
	st, err := fs.DeviceOf(stagingPath)
	if err != nil {
		return nil, err
	}
	return &quiesce.Target{Kind: quiesce.Filesystem, Path: stagingPath, Dev: st, Volume: volume}, nil
}
