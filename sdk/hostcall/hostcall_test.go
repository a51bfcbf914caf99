//go:build !wasip1

package hostcall_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

type wrapperCase struct {
	name string      // the host call
	req  abi.Message // what the wrapper must send
	resp abi.Message // what the host answers; nil answers Empty
	call func() (any, error)
	want any // the wrapper's result for resp (nil for error-only wrappers)
}

// ret adapts wrappers that answer only an error.
func ret(err error) (any, error) { return nil, err }

// val adapts wrappers that answer a value and an error.
func val[T any](v T, err error) (any, error) { return v, err }

func wrapperCases() []wrapperCase {
	loopDev := &abi.LoopDevice{Path: "/dev/loop3", File: "/pool/v.img", SizeBytes: 1 << 30, DirectIO: true}
	dirStatfs := &abi.DirStatfs{TotalBytes: 100, FreeBytes: 50, AvailableBytes: 40, TotalInodes: 10, FreeInodes: 5}
	poolStatus := &abi.DmPoolStatus{TransactionID: 7, UsedDataBlocks: 3, TotalDataBlocks: 100, BlockSectors: 128}
	thin := &abi.DmThinRequest{Pool: "wasmcsi-pool", ID: 4, SizeBytes: 1 << 30}
	const target = "iqn.2024-01.dev.wasmcsi:pool"
	lun := &abi.IscsiTarget{Portal: "192.0.2.5:3260", IQN: target, LUN: 3, ChapUser: "user", ChapSecret: "secret123456"}
	lioCreate := &abi.LioLunCreateRequest{Target: target, LUN: 3, Kind: "fileio", Path: "/pool/v.img", Portals: []string{"0.0.0.0:3260"}}
	lvCreate := &abi.LvmCreateRequest{VG: "vg0", Name: "v-a", SizeBytes: 1 << 30, ThinPool: "thin", Tags: []string{"k=v"}}
	lvReq := &abi.LvmLvRequest{VG: "vg0", Name: "v-a"}
	lv := &abi.LvmLv{VG: "vg0", Name: "v-a", SizeBytes: 1 << 30, ThinPool: "thin", Active: true, Path: "/dev/mapper/vg0-v--a", Major: 253, Minor: 3}
	nfsMountReq := &abi.NfsMountRequest{Server: "192.0.2.7", Export: "/srv/v1", Target: "/mnt/v1", Version: "4.2", Options: []string{"soft"}, TimeoutMillis: 5000}
	nfsMount := &abi.NfsMount{Server: "192.0.2.7", Export: "/srv/v1", Target: "/mnt/v1", Version: "4.2", Reachable: true, TotalBytes: 1 << 30}
	nfsTarget := &abi.NfsTargetRequest{Target: "/mnt/v1", TimeoutMillis: 5000}
	nfsDir := &abi.NfsDirRequest{Target: "/mnt/share", Name: "v1", NewName: "v1.archived", TimeoutMillis: 5000}
	nfsdClient := &abi.NfsdClientRequest{Path: "/pool/v1", Client: abi.NfsdClient{Address: "192.0.2.8"}}
	nfsdExportReq := &abi.NfsdExportRequest{Path: "/pool/v1", Clients: []abi.NfsdClient{{Address: "192.0.2.8"}}}
	nfsdExport := &abi.NfsdExport{Path: "/pool/v1", Clients: []abi.NfsdClient{{Address: "192.0.2.8"}}, Active: true}
	nvmeNS := &abi.NvmeNamespace{Address: "192.0.2.5:4420", Subsystem: "nqn.2024-01.dev.wasmcsi:v1", UUID: "0b5e3c8a-3f7e-4c1e-9d2a-6f4b8e1a2c3d"}
	nvmetCreate := &abi.NvmetNamespaceCreateRequest{Subsystem: "nqn.2024-01.dev.wasmcsi:v1", NSID: 1, Path: "/pool/v.img",
		UUID: "0b5e3c8a-3f7e-4c1e-9d2a-6f4b8e1a2c3d", Ports: []string{"0.0.0.0:4420"}}
	nvmetNS := &abi.NvmetNamespaceRequest{Subsystem: "nqn.2024-01.dev.wasmcsi:v1", NSID: 1, Path: "/pool/v.img"}
	nvmetHost := &abi.NvmetHostRequest{Subsystem: "nqn.2024-01.dev.wasmcsi:v1", Host: "nqn.2014-08.org.nvmexpress:uuid:x"}
	grant := &abi.LioGrantRequest{Target: target, LUN: 3, Initiator: "iqn.1993-08.org.debian:01:abc"}
	ifaces := &abi.NetInterfaces{Interfaces: []abi.NetInterface{{Name: "lo", Index: 1, Up: true, Running: true, Loopback: true, MTU: 65536, Addrs: []string{"127.0.0.1/8"}}}}
	return []wrapperCase{
		{abi.HostCallLoopAttach, &abi.LoopAttachRequest{File: "/pool/v.img", DirectIO: true}, loopDev,
			func() (any, error) {
				return val(hostcall.LoopAttach(&abi.LoopAttachRequest{File: "/pool/v.img", DirectIO: true}))
			}, loopDev},
		{abi.HostCallLoopFind, &abi.LoopFileRequest{File: "/pool/v.img"}, &abi.LoopFindResponse{Found: true, Device: *loopDev},
			func() (any, error) { return val(hostcall.LoopFind("/pool/v.img")) }, &abi.LoopFindResponse{Found: true, Device: *loopDev}},
		{abi.HostCallLoopResize, &abi.LoopDeviceRequest{Device: "/dev/loop3"}, &abi.LoopResizeResponse{SizeBytes: 2 << 30},
			func() (any, error) { return val(hostcall.LoopResize("/dev/loop3")) }, int64(2 << 30)},
		{abi.HostCallLoopDetach, &abi.LoopDeviceRequest{Device: "/dev/loop3"}, nil,
			func() (any, error) { return ret(hostcall.LoopDetach("/dev/loop3")) }, nil},

		{abi.HostCallFileCreate, &abi.FileCreateRequest{Path: "/pool/v.img", SizeBytes: 1 << 20, Prealloc: true}, nil,
			func() (any, error) {
				return ret(hostcall.FileCreate(&abi.FileCreateRequest{Path: "/pool/v.img", SizeBytes: 1 << 20, Prealloc: true}))
			}, nil},
		{abi.HostCallFileResize, &abi.FileResizeRequest{Path: "/pool/v.img", SizeBytes: 2 << 20}, nil,
			func() (any, error) {
				return ret(hostcall.FileResize(&abi.FileResizeRequest{Path: "/pool/v.img", SizeBytes: 2 << 20}))
			}, nil},
		{abi.HostCallFileRemove, &abi.FileRequest{Path: "/pool/v.img"}, nil,
			func() (any, error) { return ret(hostcall.FileRemove("/pool/v.img")) }, nil},
		{abi.HostCallFileClone, &abi.FileCloneRequest{Source: "/pool/a.img", Target: "/pool/b.img"}, nil,
			func() (any, error) { return ret(hostcall.FileClone("/pool/a.img", "/pool/b.img")) }, nil},
		{abi.HostCallFileStat, &abi.FileRequest{Path: "/pool/v.img"}, &abi.FileStat{SizeBytes: 1 << 20, AllocatedBytes: 4096},
			func() (any, error) { return val(hostcall.FileStat("/pool/v.img")) }, &abi.FileStat{SizeBytes: 1 << 20, AllocatedBytes: 4096}},
		{abi.HostCallFileStatfs, &abi.FileRequest{Path: "/pool"}, &abi.FileStatfs{TotalBytes: 100, AvailableBytes: 60, UsedBytes: 40},
			func() (any, error) { return val(hostcall.FileStatfs("/pool")) }, &abi.FileStatfs{TotalBytes: 100, AvailableBytes: 60, UsedBytes: 40}},
		{abi.HostCallFileList, &abi.ListRequest{Pool: "/pool"}, &abi.ListPage{Names: []string{"v.img"}},
			func() (any, error) { return val(hostcall.FileList(&abi.ListRequest{Pool: "/pool"})) }, &abi.ListPage{Names: []string{"v.img"}}},

		{abi.HostCallDirCreate, &abi.DirCreateRequest{Path: "/pool/v", QuotaBytes: 1 << 20}, nil,
			func() (any, error) {
				return ret(hostcall.DirCreate(&abi.DirCreateRequest{Path: "/pool/v", QuotaBytes: 1 << 20}))
			}, nil},
		{abi.HostCallDirRemove, &abi.DirRequest{Path: "/pool/v"}, nil,
			func() (any, error) { return ret(hostcall.DirRemove("/pool/v")) }, nil},
		{abi.HostCallDirCopy, &abi.DirCopyRequest{Source: "/pool/a", Target: "/pool/b"}, nil,
			func() (any, error) { return ret(hostcall.DirCopy("/pool/a", "/pool/b")) }, nil},
		{abi.HostCallDirStatfs, &abi.DirRequest{Path: "/pool"}, dirStatfs,
			func() (any, error) { return val(hostcall.DirStatfs("/pool")) }, dirStatfs},
		{abi.HostCallDirUsage, &abi.DirRequest{Path: "/pool/v"}, &abi.DirUsage{UsedBytes: 8192, UsedInodes: 2},
			func() (any, error) { return val(hostcall.DirUsage("/pool/v")) }, &abi.DirUsage{UsedBytes: 8192, UsedInodes: 2}},
		{abi.HostCallDirSetQuota, &abi.DirQuotaRequest{Path: "/pool/v", QuotaBytes: 1 << 30}, nil,
			func() (any, error) { return ret(hostcall.DirSetQuota("/pool/v", 1<<30)) }, nil},
		{abi.HostCallDirQuotaSupported, &abi.DirRequest{Path: "/pool"}, &abi.DirQuotaSupport{Reason: "ext4 without prjquota"},
			func() (any, error) { return val(hostcall.DirQuotaSupported("/pool")) }, &abi.DirQuotaSupport{Reason: "ext4 without prjquota"}},
		{abi.HostCallDirExists, &abi.DirRequest{Path: "/pool/v"}, &abi.DirExists{Exists: true},
			func() (any, error) { return val(hostcall.DirExists("/pool/v")) }, true},
		{abi.HostCallDirList, &abi.ListRequest{Pool: "/pool", After: "v-a", Limit: 2}, &abi.ListPage{Names: []string{"v-b", "v-c"}, Next: "v-c"},
			func() (any, error) {
				return val(hostcall.DirList(&abi.ListRequest{Pool: "/pool", After: "v-a", Limit: 2}))
			}, &abi.ListPage{Names: []string{"v-b", "v-c"}, Next: "v-c"}},

		{abi.HostCallMountBind, &abi.MountBindRequest{Source: "/pool/v", Target: "/staging/v", ReadOnly: true}, &abi.MountChange{Changed: true},
			func() (any, error) {
				return val(hostcall.MountBind(&abi.MountBindRequest{Source: "/pool/v", Target: "/staging/v", ReadOnly: true}))
			}, &abi.MountChange{Changed: true}},
		{abi.HostCallMountUnmount, &abi.MountUnmountRequest{Target: "/staging/v", Lazy: true}, &abi.MountChange{Changed: true},
			func() (any, error) {
				return val(hostcall.MountUnmount(&abi.MountUnmountRequest{Target: "/staging/v", Lazy: true}))
			},
			&abi.MountChange{Changed: true}},
		{abi.HostCallMountInfo, &abi.MountInfoRequest{Target: "/staging/v"}, &abi.MountInfo{Mounted: true, Source: "/dev/loop3", FSType: "xfs", Options: []string{"rw"}},
			func() (any, error) { return val(hostcall.MountInfo("/staging/v")) },
			&abi.MountInfo{Mounted: true, Source: "/dev/loop3", FSType: "xfs", Options: []string{"rw"}}},

		{abi.HostCallDmPoolOpen, &abi.DmPoolOpenRequest{Pool: "wasmcsi-pool", MetaDev: "/dev/loop1", DataDev: "/dev/loop2", BlockSectors: 128, Format: true},
			&abi.DmPoolOpenResponse{Path: "/dev/mapper/wasmcsi-pool", Formatted: true, BlockSectors: 128, Status: *poolStatus},
			func() (any, error) {
				return val(hostcall.DmPoolOpen(&abi.DmPoolOpenRequest{Pool: "wasmcsi-pool", MetaDev: "/dev/loop1", DataDev: "/dev/loop2", BlockSectors: 128, Format: true}))
			}, &abi.DmPoolOpenResponse{Path: "/dev/mapper/wasmcsi-pool", Formatted: true, BlockSectors: 128, Status: *poolStatus}},
		{abi.HostCallDmPoolStatus, &abi.DmPoolRequest{Pool: "wasmcsi-pool"}, poolStatus,
			func() (any, error) { return val(hostcall.DmPoolStatus(&abi.DmPoolRequest{Pool: "wasmcsi-pool"})) }, poolStatus},
		{abi.HostCallDmThinCreate, thin, &abi.DmThinResponse{Path: "/dev/mapper/wasmcsi-thin-4"},
			func() (any, error) { return val(hostcall.DmThinCreate(thin)) }, &abi.DmThinResponse{Path: "/dev/mapper/wasmcsi-thin-4"}},
		{abi.HostCallDmThinActivate, thin, &abi.DmThinResponse{Path: "/dev/mapper/wasmcsi-thin-4"},
			func() (any, error) { return val(hostcall.DmThinActivate(thin)) }, &abi.DmThinResponse{Path: "/dev/mapper/wasmcsi-thin-4"}},
		{abi.HostCallDmThinDeactivate, thin, nil, func() (any, error) { return ret(hostcall.DmThinDeactivate(thin)) }, nil},
		{abi.HostCallDmThinDelete, thin, nil, func() (any, error) { return ret(hostcall.DmThinDelete(thin)) }, nil},
		{abi.HostCallDmThinResize, thin, nil, func() (any, error) { return ret(hostcall.DmThinResize(thin)) }, nil},
		{abi.HostCallDmThinSnapshot, &abi.DmThinSnapshotRequest{Pool: "wasmcsi-pool", OriginID: 4, SnapshotID: 5}, nil,
			func() (any, error) {
				return ret(hostcall.DmThinSnapshot(&abi.DmThinSnapshotRequest{Pool: "wasmcsi-pool", OriginID: 4, SnapshotID: 5}))
			}, nil},

		{abi.HostCallDmThinStatus, thin, &abi.DmThinStatus{Exists: true, Active: true, Path: "/dev/mapper/wasmcsi-thin-4", SizeBytes: 1 << 30, MappedBytes: 4 << 20},
			func() (any, error) { return val(hostcall.DmThinStatus(thin)) },
			&abi.DmThinStatus{Exists: true, Active: true, Path: "/dev/mapper/wasmcsi-thin-4", SizeBytes: 1 << 30, MappedBytes: 4 << 20}},

		{abi.HostCallIscsiLogin, lun, &abi.IscsiLoginResponse{Device: "/dev/sdb"},
			func() (any, error) { return val(hostcall.IscsiLogin(lun)) }, &abi.IscsiLoginResponse{Device: "/dev/sdb"}},
		{abi.HostCallIscsiLogout, lun, nil, func() (any, error) { return ret(hostcall.IscsiLogout(lun)) }, nil},
		{abi.HostCallIscsiRescan, lun, &abi.IscsiRescanResponse{SizeBytes: 2 << 30},
			func() (any, error) { return val(hostcall.IscsiRescan(lun)) }, &abi.IscsiRescanResponse{SizeBytes: 2 << 30}},
		{abi.HostCallIscsiInitiatorName, &abi.Empty{}, &abi.IscsiInitiatorName{Name: "iqn.1993-08.org.debian:01:abc"},
			func() (any, error) { return val(hostcall.IscsiInitiatorName()) }, "iqn.1993-08.org.debian:01:abc"},

		{abi.HostCallLioLunCreate, lioCreate, nil, func() (any, error) { return ret(hostcall.LioLunCreate(lioCreate)) }, nil},
		{abi.HostCallLioLunDelete, &abi.LioLunRequest{Target: target, LUN: 3, Path: "/pool/v.img"}, nil,
			func() (any, error) {
				return ret(hostcall.LioLunDelete(&abi.LioLunRequest{Target: target, LUN: 3, Path: "/pool/v.img"}))
			}, nil},
		{abi.HostCallLioGrant, grant, nil, func() (any, error) { return ret(hostcall.LioGrant(grant)) }, nil},
		{abi.HostCallLioRevoke, grant, nil, func() (any, error) { return ret(hostcall.LioRevoke(grant)) }, nil},
		{abi.HostCallLioLunResize, &abi.LioLunResizeRequest{Target: target, LUN: 3, SizeBytes: 2 << 30}, nil,
			func() (any, error) {
				return ret(hostcall.LioLunResize(&abi.LioLunResizeRequest{Target: target, LUN: 3, SizeBytes: 2 << 30}))
			}, nil},

		{abi.HostCallLvmVgStatus, &abi.LvmVgRequest{VG: "vg0"}, &abi.LvmVgStatus{VG: "vg0", SizeBytes: 1 << 30, FreeBytes: 1 << 29, ExtentBytes: 4 << 20, PVCount: 1},
			func() (any, error) { return val(hostcall.LvmVgStatus(&abi.LvmVgRequest{VG: "vg0"})) },
			&abi.LvmVgStatus{VG: "vg0", SizeBytes: 1 << 30, FreeBytes: 1 << 29, ExtentBytes: 4 << 20, PVCount: 1}},
		{abi.HostCallLvmPoolStatus, &abi.LvmPoolRequest{VG: "vg0", Pool: "thin"}, &abi.LvmPoolStatus{VG: "vg0", Pool: "thin", DataPercent: 9100, Active: true},
			func() (any, error) { return val(hostcall.LvmPoolStatus(&abi.LvmPoolRequest{VG: "vg0", Pool: "thin"})) },
			&abi.LvmPoolStatus{VG: "vg0", Pool: "thin", DataPercent: 9100, Active: true}},
		{abi.HostCallLvmLvCreate, lvCreate, lv, func() (any, error) { return val(hostcall.LvmLvCreate(lvCreate)) }, lv},
		{abi.HostCallLvmLvRemove, lvReq, nil, func() (any, error) { return ret(hostcall.LvmLvRemove(lvReq)) }, nil},
		{abi.HostCallLvmLvExtend, &abi.LvmExtendRequest{VG: "vg0", Name: "v-a", SizeBytes: 2 << 30}, lv,
			func() (any, error) {
				return val(hostcall.LvmLvExtend(&abi.LvmExtendRequest{VG: "vg0", Name: "v-a", SizeBytes: 2 << 30}))
			}, lv},
		{abi.HostCallLvmLvSnapshot, &abi.LvmSnapshotRequest{VG: "vg0", Origin: "v-a", Name: "s-a"}, lv,
			func() (any, error) {
				return val(hostcall.LvmLvSnapshot(&abi.LvmSnapshotRequest{VG: "vg0", Origin: "v-a", Name: "s-a"}))
			}, lv},
		{abi.HostCallLvmLvActivate, lvReq, lv, func() (any, error) { return val(hostcall.LvmLvActivate(lvReq)) }, lv},
		{abi.HostCallLvmLvDeactivate, lvReq, nil, func() (any, error) { return ret(hostcall.LvmLvDeactivate(lvReq)) }, nil},
		{abi.HostCallLvmLvStatus, lvReq, lv, func() (any, error) { return val(hostcall.LvmLvStatus(lvReq)) }, lv},
		{abi.HostCallLvmLvList, &abi.LvmListRequest{VG: "vg0"}, &abi.LvmLvList{LVs: []abi.LvmLv{*lv}},
			func() (any, error) { return val(hostcall.LvmLvList(&abi.LvmListRequest{VG: "vg0"})) }, &abi.LvmLvList{LVs: []abi.LvmLv{*lv}}},
		{abi.HostCallNvmeConnect, nvmeNS, &abi.NvmeConnectResponse{Device: "/dev/nvme1n1", Controller: "nvme1"},
			func() (any, error) { return val(hostcall.NvmeConnect(nvmeNS)) }, &abi.NvmeConnectResponse{Device: "/dev/nvme1n1", Controller: "nvme1"}},
		{abi.HostCallNvmeDisconnect, nvmeNS, nil, func() (any, error) { return ret(hostcall.NvmeDisconnect(nvmeNS)) }, nil},
		{abi.HostCallNvmeRescan, nvmeNS, &abi.NvmeRescanResponse{SizeBytes: 2 << 30},
			func() (any, error) { return val(hostcall.NvmeRescan(nvmeNS)) }, &abi.NvmeRescanResponse{SizeBytes: 2 << 30}},
		{abi.HostCallNvmeHostNqn, &abi.Empty{}, &abi.NvmeHostNQN{NQN: "nqn.2014-08.org.nvmexpress:uuid:x"},
			func() (any, error) { return val(hostcall.NvmeHostNqn()) }, "nqn.2014-08.org.nvmexpress:uuid:x"},
		{abi.HostCallNvmetNamespaceCreate, nvmetCreate, nil, func() (any, error) { return ret(hostcall.NvmetNamespaceCreate(nvmetCreate)) }, nil},
		{abi.HostCallNvmetNamespaceDelete, nvmetNS, nil, func() (any, error) { return ret(hostcall.NvmetNamespaceDelete(nvmetNS)) }, nil},
		{abi.HostCallNvmetNamespaceResize, nvmetNS, &abi.NvmetNamespaceResizeResponse{SizeBytes: 2 << 30},
			func() (any, error) { return val(hostcall.NvmetNamespaceResize(nvmetNS)) }, &abi.NvmetNamespaceResizeResponse{SizeBytes: 2 << 30}},
		{abi.HostCallNvmetHostAllow, nvmetHost, nil, func() (any, error) { return ret(hostcall.NvmetHostAllow(nvmetHost)) }, nil},
		{abi.HostCallNvmetHostDeny, nvmetHost, nil, func() (any, error) { return ret(hostcall.NvmetHostDeny(nvmetHost)) }, nil},
		{abi.HostCallNfsMount, nfsMountReq, nfsMount, func() (any, error) { return val(hostcall.NfsMount(nfsMountReq)) }, nfsMount},
		{abi.HostCallNfsUnmount, nfsTarget, nil, func() (any, error) { return ret(hostcall.NfsUnmount(nfsTarget)) }, nil},
		{abi.HostCallNfsStat, nfsTarget, nfsMount, func() (any, error) { return val(hostcall.NfsStat(nfsTarget)) }, nfsMount},
		{abi.HostCallNfsDirCreate, nfsDir, nil, func() (any, error) { return ret(hostcall.NfsDirCreate(nfsDir)) }, nil},
		{abi.HostCallNfsDirRemove, nfsDir, nil, func() (any, error) { return ret(hostcall.NfsDirRemove(nfsDir)) }, nil},
		{abi.HostCallNfsDirRename, nfsDir, nil, func() (any, error) { return ret(hostcall.NfsDirRename(nfsDir)) }, nil},
		{abi.HostCallNfsDirCopy, nfsDir, nil, func() (any, error) { return ret(hostcall.NfsDirCopy(nfsDir)) }, nil},
		{abi.HostCallNfsDirUsage, nfsDir, &abi.NfsDirUsage{Exists: true, UsedBytes: 4096, UsedInodes: 2},
			func() (any, error) { return val(hostcall.NfsDirUsage(nfsDir)) }, &abi.NfsDirUsage{Exists: true, UsedBytes: 4096, UsedInodes: 2}},
		{abi.HostCallNfsdExport, nfsdExportReq, nfsdExport, func() (any, error) { return val(hostcall.NfsdExport(nfsdExportReq)) }, nfsdExport},
		{abi.HostCallNfsdUnexport, &abi.NfsdRequest{Path: "/pool/v1"}, nil, func() (any, error) { return ret(hostcall.NfsdUnexport("/pool/v1")) }, nil},
		{abi.HostCallNfsdClientAdd, nfsdClient, nfsdExport, func() (any, error) { return val(hostcall.NfsdClientAdd(nfsdClient)) }, nfsdExport},
		{abi.HostCallNfsdClientRemove, nfsdClient, nfsdExport, func() (any, error) { return val(hostcall.NfsdClientRemove(nfsdClient)) }, nfsdExport},
		{abi.HostCallNfsdList, &abi.NfsdListRequest{Root: "/pool"}, &abi.NfsdExports{Exports: []abi.NfsdExport{*nfsdExport}, Running: true},
			func() (any, error) { return val(hostcall.NfsdList(&abi.NfsdListRequest{Root: "/pool"})) },
			&abi.NfsdExports{Exports: []abi.NfsdExport{*nfsdExport}, Running: true}},

		{abi.HostCallNetRouteTo, &abi.NetRouteToRequest{IP: "192.0.2.5"}, &abi.NetRoute{Interface: "eth0", Src: "192.0.2.1"},
			func() (any, error) { return val(hostcall.NetRouteTo(&abi.NetRouteToRequest{IP: "192.0.2.5"})) },
			&abi.NetRoute{Interface: "eth0", Src: "192.0.2.1"}},
		{abi.HostCallNetInterfaces, &abi.Empty{}, ifaces, func() (any, error) { return val(hostcall.NetInterfaces()) }, ifaces},
	}
}

// install makes fn the native host's answer to name for the rest of the
// test and returns the names of the calls the host received. The fake is
// local: the sdk module's tests need nothing outside abi and sdk, and
// sdk/moduletest's FakeHost brings in the daemon.
func install(t *testing.T, name string, fn func(req []byte) ([]byte, error)) *[]string {
	t.Helper()
	var calls []string
	hostcall.SetHost(func(got string, req []byte) ([]byte, error) {
		calls = append(calls, got)
		if got != name {
			return nil, &abi.Error{Code: abi.Unimplemented, Message: "no handler for " + got}
		}
		return fn(req)
	})
	t.Cleanup(func() { hostcall.SetHost(nil) })
	return &calls
}

// TestWrappersCoverEveryImport keeps the table in step with the imports
// the SDK declares for modules.
func TestWrappersCoverEveryImport(t *testing.T) {
	src, err := os.ReadFile("imports_wasip1.go")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, tc := range wrapperCases() {
		have[tc.name] = true
	}
	imports := regexp.MustCompile(`(?m)^//go:wasmimport wasmcsi (\w+)$`).FindAllStringSubmatch(string(src), -1)
	if len(imports) == 0 {
		t.Fatal("no wasmcsi imports found in imports_wasip1.go")
	}
	for _, m := range imports {
		if !have[m[1]] {
			t.Errorf("no wrapper case for host call %s", m[1])
		}
	}
}

func TestWrappersSendAndDecode(t *testing.T) {
	for _, tc := range wrapperCases() {
		t.Run(tc.name, func(t *testing.T) {
			var got []byte
			received := install(t, tc.name, func(req []byte) ([]byte, error) {
				got = req
				if tc.resp == nil {
					return nil, nil
				}
				return tc.resp.AppendWire(nil), nil
			})
			res, err := tc.call()
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if calls := *received; len(calls) != 1 || calls[0] != tc.name {
				t.Fatalf("host calls %v, want [%s]", calls, tc.name)
			}
			if want := tc.req.AppendWire(nil); string(got) != string(want) {
				t.Errorf("request %x, want %x (%+v)", got, want, tc.req)
			}
			if !reflect.DeepEqual(res, tc.want) {
				t.Errorf("result %#v, want %#v", res, tc.want)
			}
		})
	}
}

func TestWrappersKeepErrorCodes(t *testing.T) {
	for _, ec := range []struct {
		name string
		err  error
		code abi.Code
		msg  string
	}{
		{"abi error", abi.Errorf(abi.NotFound, "no such file"), abi.NotFound, "no such file"},
		{"wrapped abi error", fmt.Errorf("/pool/x: %w", abi.Errorf(abi.PermissionDenied, "outside the granted roots")),
			abi.PermissionDenied, "/pool/x: PERMISSION_DENIED: outside the granted roots"},
		{"plain error", errors.New("EIO"), abi.Internal, "EIO"},
		{"abi error with code OK", &abi.Error{Code: abi.OK, Message: "odd"}, abi.Internal, "OK: odd"},
	} {
		t.Run(ec.name, func(t *testing.T) {
			for _, tc := range wrapperCases() {
				install(t, tc.name, func([]byte) ([]byte, error) { return nil, ec.err })
				_, err := tc.call()
				var e *abi.Error
				if !errors.As(err, &e) || e.Code != ec.code || e.Message != ec.msg {
					t.Errorf("%s: error %#v, want %v %q", tc.name, err, ec.code, ec.msg)
				}
			}
		})
	}
}

func TestWrappersRefuseGarbageAnswers(t *testing.T) {
	for _, tc := range wrapperCases() {
		if tc.resp == nil {
			continue
		}
		install(t, tc.name, func([]byte) ([]byte, error) { return []byte{0x0a, 0x05, 'x'}, nil })
		_, err := tc.call()
		if abi.CodeOf(err) != abi.Internal || !strings.Contains(err.Error(), "does not decode") {
			t.Errorf("%s: %v, want INTERNAL: host answer does not decode", tc.name, err)
		}
	}
}

func TestNoHostIsUnavailable(t *testing.T) {
	hostcall.SetHost(nil)
	for _, tc := range wrapperCases() {
		_, err := tc.call()
		if abi.CodeOf(err) != abi.Unavailable || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s without a host: %v, want UNAVAILABLE naming the call", tc.name, err)
		}
	}
}

// TestLog checks the native log: warnings and errors reach stderr, lower
// levels are dropped, Logf joins its parts.
func TestLog(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	t.Cleanup(func() { os.Stderr = stderr })
	hostcall.Log(abi.LogDebug, "debug line")
	hostcall.Log(abi.LogInfo, "info line")
	hostcall.Log(abi.LogWarn, "warn line")
	hostcall.Logf(abi.LogError, "pool ", "/pool", " is full")
	w.Close()
	os.Stderr = stderr
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := "warn line\npool /pool is full\n"; string(out) != want {
		t.Errorf("stderr %q, want %q", out, want)
	}
}
