package state

import (
	"strconv"
	"sync/atomic"
	"testing"
)

// BenchmarkPutDelete measures durable create+delete pairs of a typical
// volume record, each write its own fsynced commit or a share of a batch.
// Run with -cpu 1,8 for one and eight concurrent writers.
func BenchmarkPutDelete(b *testing.B) {
	s := openStore(b)
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "pvc-" + strconv.FormatInt(n.Add(1), 10)
			v := Volume{
				ID: id, Name: id, Backend: "loop", LocalID: "lv-" + id, CapacityBytes: 1 << 30,
				Parameters:   map[string]string{"fsType": "ext4"},
				Context:      map[string]string{"loop.wasmcsi.io/file": "/pool/" + id},
				Capabilities: []Capability{{FsType: "ext4", AccessMode: 1}},
				CreatedAt:    created,
			}
			if err := s.PutVolume(v); err != nil {
				b.Error(err)
				return
			}
			if err := s.DeleteVolume(id); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}

// BenchmarkGetVolume measures a read among 1000 records.
func BenchmarkGetVolume(b *testing.B) {
	s := openStore(b)
	for i := range 1000 {
		if err := s.PutVolume(fullVolume("vol-"+strconv.Itoa(i), "")); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.GetVolume("vol-" + strconv.Itoa(i%1000)); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}
