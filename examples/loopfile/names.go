package main

import (
	"strconv"
	"strings"
)

// File names in the pool: "<local ID>.img" for volumes, "<local ID>.snap"
// for snapshots.
const (
	volumeSuffix   = ".img"
	snapshotSuffix = ".snap"
)

// joinPath puts a file name into a folder.
func joinPath(dir, name string) string {
	if strings.HasSuffix(dir, "/") {
		return dir + name
	}
	return dir + "/" + name
}

// dirOf is the folder part of an absolute path.
func dirOf(path string) string {
	i := strings.LastIndexByte(path, '/')
	if i <= 0 {
		return "/"
	}
	return path[:i]
}

// baseOf is the last element of a path.
func baseOf(path string) string {
	return path[strings.LastIndexByte(path, '/')+1:]
}

// itoa formats an int64 without fmt.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
