// Command vcsim is the vCenter simulator harness of the vim_api tests (DESIGN.md section 7).
//
// It runs govmomi's vCenter simulator (simulator.VPX(), Debian golang-github-vmware-govmomi-dev)
// over TLS on a loopback address, checks the password of the one configured user, and adds what
// the simulator lacks for a migration, keeping its own behaviour for everything else:
//
//   - Snapshots freeze disks. When CreateSnapshot_Task registers a snapshot, the harness copies
//     each disk's files (descriptor and extents, or a monolithicSparse file) to
//     "<disk>-<snapshot>.vmdk" and points the snapshot's configuration at that copy, so a reader
//     of the snapshot's disks sees the bytes as of the snapshot while the test keeps writing the
//     VM's active disk file. RemoveSnapshot_Task deletes the copy.
//   - ESXi-style delta chains, for VMs created with "delta_snapshots": the first snapshot is a
//     frozen copy as above; each later one is a hosted sparse delta (qemu-img create -b) over
//     the previous live snapshot's disk holding that snapshot's guest writes, checked equal to
//     the active disk with qemu-img compare, and its backing names the parent
//     (VirtualDiskFlatVer2BackingInfo.parent). Removing a snapshot consolidates as ESXi does: a
//     child delta over its disks is flattened into a standalone file first.
//   - Changed block tracking. With changeTrackingEnabled, each snapshot gets a new changeId per
//     disk (reported in the snapshot's disk backing `changeId`) and the harness keeps the disk's
//     contents at that changeId (a raw image converted with qemu-img). QueryChangedDiskAreas
//     compares the snapshot's contents with the contents at the given changeId in 64 KiB blocks
//     and answers the changed areas of one window (-cbt-page bytes) from startOffset, so clients
//     must page from startOffset + length. An unknown changeId is an InvalidArgument fault.
//     Parameters must come in schema order (_this, snapshot, deviceKey, startOffset, changeId).
//   - A control API under /harness/ (bearer token = the password): POST /harness/vms creates a VM
//     whose disks are existing files of the datastore; GET /harness/vms/{moref} reports its power
//     state, annotation, custom values, snapshots and delta disks made;
//     POST /harness/vms/{moref}/reset-cbt forgets its changeIds (as a CBT reset does);
//     POST /harness/vms/{moref}/disable?method=Name disables a method on the VM (vSphere's
//     disabledMethod); POST /harness/vms/{moref}/writes schedules guest writes to the VM's
//     active disks before given snapshots (see guestWrite); POST /harness/vms/{moref}/ignore-shutdown
//     makes ShutdownGuest on the VM answer success without powering it off (a guest that ignores
//     the shutdown request, so clients fall back to power-off); GET /harness/stats counts the bytes
//     of datastore files served under /folder (folder_bytes).
//
// On start it prints one JSON line on stdout: {url, datacenter, datastores: [{name, dir}],
// cert_pem, thumbprint}.
//
// Build (offline, GOPATH mode): GO111MODULE=off GOPATH=<dir>:/usr/share/gocode go build -o vcsim .
package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"encoding/xml"
	"flag"
	"fmt"
	"html"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

const blockSize = 64 * 1024

// cbtState is the harness's changed block tracking: the raw contents of each disk at each changeId.
type cbtState struct {
	mu         sync.Mutex
	stateDir   string
	seq        int
	raw        map[string]string                            // changeId -> raw image path
	vmIds      map[string][]string                          // vm moref -> changeIds
	frozen     map[string][]string                          // snapshot moref -> frozen files (absolute)
	dsDirs     map[string]string                            // datastore name -> local dir
	taken      map[string]int                               // vm moref -> snapshots taken
	writes     map[string][]guestWrite                      // vm moref -> scheduled guest writes
	deltaVMs   map[string]bool                              // vm moref -> snapshots are delta chains
	last       map[string]*simulator.VirtualMachineSnapshot // vm moref -> newest live snapshot
	parentOf   map[string]*simulator.VirtualMachineSnapshot // snapshot moref -> the snapshot its deltas lie on
	deltasMade map[string]int                               // vm moref -> delta disks made
}

var cbt = &cbtState{raw: map[string]string{}, vmIds: map[string][]string{}, frozen: map[string][]string{}, dsDirs: map[string]string{}, taken: map[string]int{}, writes: map[string][]guestWrite{},
	deltaVMs: map[string]bool{}, last: map[string]*simulator.VirtualMachineSnapshot{}, parentOf: map[string]*simulator.VirtualMachineSnapshot{}, deltasMade: map[string]int{}}

// guestWrite stands for the guest writing to its disk while it runs: before the VM's snapshot
// number Before (0 = the first) is taken -- or before every snapshot from Before on when Every is
// set -- Length bytes of Pattern are written at Offset of the disk File (relative to the
// datastore) with qemu-io, so the disk's contents really change between snapshots.
type guestWrite struct {
	Before  int    `json:"before_snapshot"`
	Every   bool   `json:"every"`
	File    string `json:"file"`
	Offset  int64  `json:"offset"`
	Length  int64  `json:"length"`
	Pattern int    `json:"pattern"`
}

// applyWrites applies the guest writes due before snapshot n and returns the qemu-io commands
// it ran, by disk file (relative to the datastore).
func applyWrites(vm string, n int) (map[string][]string, error) {
	cbt.mu.Lock()
	var todo []guestWrite
	for _, w := range cbt.writes[vm] {
		if w.Before == n || (w.Every && n >= w.Before) {
			todo = append(todo, w)
		}
	}
	dir := ""
	for _, d := range cbt.dsDirs {
		dir = d
	}
	cbt.mu.Unlock()
	done := map[string][]string{}
	for _, w := range todo {
		cmd := fmt.Sprintf("write -P %d %d %d", (w.Pattern+n)&0xff, w.Offset, w.Length)
		out, err := exec.Command("qemu-io", "-f", "vmdk", "-c", cmd, filepath.Join(dir, w.File)).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("qemu-io: %v: %s", err, out)
		}
		done[w.File] = append(done[w.File], cmd)
	}
	return done, nil
}

// snapshotHandler implements simulator.RegisterObject: it sees every object the registry puts
// or removes, and acts on snapshots.
type snapshotHandler struct{}

func (snapshotHandler) Reference() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "HarnessSnapshotHandler", Value: "harness-1"}
}

func (snapshotHandler) UpdateObject(mo.Reference, []types.PropertyChange) {}

func (snapshotHandler) PutObject(item mo.Reference) {
	snap, ok := item.(*simulator.VirtualMachineSnapshot)
	if !ok {
		return
	}
	if err := freezeSnapshot(snap); err != nil {
		log.Printf("harness: freezing snapshot %s: %v", snap.Self.Value, err)
	}
}

func (snapshotHandler) RemoveObject(ref types.ManagedObjectReference) {
	if ref.Type != "VirtualMachineSnapshot" {
		return
	}
	cbt.mu.Lock()
	var children []*simulator.VirtualMachineSnapshot
	for child, parent := range cbt.parentOf {
		if parent.Self.Value == ref.Value {
			children = append(children, cbt.snapshotByRef(child))
			delete(cbt.parentOf, child)
		}
	}
	for vm, last := range cbt.last {
		if last.Self.Value == ref.Value {
			delete(cbt.last, vm)
		}
	}
	cbt.mu.Unlock()
	for _, c := range children {
		if c != nil {
			if err := consolidate(c); err != nil {
				log.Printf("harness: consolidating snapshot %s: %v", c.Self.Value, err)
			}
		}
	}
	cbt.mu.Lock()
	files := cbt.frozen[ref.Value]
	delete(cbt.frozen, ref.Value)
	cbt.mu.Unlock()
	for _, f := range files {
		_ = os.Remove(f)
	}
}

// snapshotByRef finds a live snapshot the harness made delta disks for (cbt.mu held).
func (c *cbtState) snapshotByRef(ref string) *simulator.VirtualMachineSnapshot {
	for _, s := range c.last {
		if s.Self.Value == ref {
			return s
		}
	}
	s, _ := simulator.Map.Get(types.ManagedObjectReference{Type: "VirtualMachineSnapshot", Value: ref}).(*simulator.VirtualMachineSnapshot)
	return s
}

// consolidate turns every delta disk of snap into a standalone file (its parent is going away)
// and drops the parent from its backing, as ESXi's snapshot consolidation leaves it.
func consolidate(snap *simulator.VirtualMachineSnapshot) error {
	for _, d := range snap.Config.Hardware.Device {
		disk, ok := d.(*types.VirtualDisk)
		if !ok {
			continue
		}
		b, ok := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
		if !ok || b.Parent == nil {
			continue
		}
		ds, rel, err := dsPath(b.FileName)
		if err != nil {
			return err
		}
		file := filepath.Join(cbt.dsDirs[ds], rel)
		tmpDir := file + ".consolidate"
		if err := os.MkdirAll(tmpDir, 0o755); err != nil {
			return err
		}
		tmp := filepath.Join(tmpDir, filepath.Base(file))
		if out, err := exec.Command("qemu-img", "convert", "-f", "vmdk", "-O", "vmdk", file, tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("qemu-img convert: %v: %s", err, out)
		}
		if err := os.Rename(tmp, file); err != nil {
			return err
		}
		_ = os.RemoveAll(tmpDir)
		b.Parent = nil
	}
	return nil
}

// deltaDisk makes the snapshot disk of `active` as a hosted sparse delta over `parent` (a frozen
// disk of the previous snapshot, in the same directory) holding the guest writes `cmds`, and
// checks it reads as the active disk does. Returns its datastore path and the file it created.
func deltaDisk(active, parent, tag string, cmds []string) (string, []string, error) {
	ds, rel, err := dsPath(active)
	if err != nil {
		return "", nil, err
	}
	_, parentRel, err := dsPath(parent)
	if err != nil {
		return "", nil, err
	}
	dir := cbt.dsDirs[ds]
	dstRel := fmt.Sprintf("%s-%s.vmdk", strings.TrimSuffix(rel, ".vmdk"), tag)
	dst := filepath.Join(dir, dstRel)
	if filepath.Dir(dst) != filepath.Dir(filepath.Join(dir, parentRel)) {
		return "", nil, fmt.Errorf("delta %s and parent %s lie in different directories", dstRel, parentRel)
	}
	create := exec.Command("qemu-img", "create", "-q", "-f", "vmdk", "-b", filepath.Base(parentRel), "-F", "vmdk", filepath.Base(dst))
	create.Dir = filepath.Dir(dst)
	if out, err := create.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("qemu-img create: %v: %s", err, out)
	}
	for _, cmd := range cmds {
		if out, err := exec.Command("qemu-io", "-f", "vmdk", "-c", cmd, dst).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("qemu-io: %v: %s", err, out)
		}
	}
	if out, err := exec.Command("qemu-img", "compare", "-f", "vmdk", "-F", "vmdk", filepath.Join(dir, rel), dst).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("delta %s does not read as %s: %v: %s", dstRel, rel, err, out)
	}
	return fmt.Sprintf("[%s] %s", ds, dstRel), []string{dst}, nil
}

// diskBacking is the flat backing of the disk with device key `key` in a snapshot's configuration.
func diskBacking(snap *simulator.VirtualMachineSnapshot, key int32) *types.VirtualDiskFlatVer2BackingInfo {
	for _, d := range snap.Config.Hardware.Device {
		if disk, ok := d.(*types.VirtualDisk); ok && disk.Key == key {
			b, _ := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
			return b
		}
	}
	return nil
}

var extentRe = regexp.MustCompile(`^(RW|RDONLY|NOACCESS)\s+(\d+)\s+(\S+)\s+"([^"]+)"(.*)$`)

// dsPath turns "[ds] dir/file" into (datastore, relative path).
func dsPath(s string) (string, string, error) {
	var p object.DatastorePath
	if !p.FromString(s) {
		return "", "", fmt.Errorf("not a datastore path: %q", s)
	}
	return p.Datastore, p.Path, nil
}

func copySparse(src, dst string) error {
	out, err := exec.Command("cp", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp %s: %v: %s", src, err, out)
	}
	return nil
}

// freezeDisk copies the disk file `file` ("[ds] dir/name.vmdk") to a frozen copy tagged `tag`
// and returns the copy's datastore path and the absolute paths it created.
func freezeDisk(file, tag string) (string, []string, error) {
	ds, rel, err := dsPath(file)
	if err != nil {
		return "", nil, err
	}
	dir, ok := cbt.dsDirs[ds]
	if !ok {
		return "", nil, fmt.Errorf("unknown datastore %q", ds)
	}
	src := filepath.Join(dir, rel)
	base := strings.TrimSuffix(rel, ".vmdk")
	dstRel := fmt.Sprintf("%s-%s.vmdk", base, tag)
	dst := filepath.Join(dir, dstRel)
	head := make([]byte, 4)
	f, err := os.Open(src)
	if err != nil {
		return "", nil, err
	}
	_, _ = io.ReadFull(f, head)
	_ = f.Close()
	created := []string{}
	if string(head) == "KDMV" {
		if err := copySparse(src, dst); err != nil {
			return "", nil, err
		}
		created = append(created, dst)
	} else {
		text, err := os.ReadFile(src)
		if err != nil {
			return "", nil, err
		}
		if len(text) > 1<<20 {
			return "", nil, fmt.Errorf("descriptor %s too large", src)
		}
		var outLines []string
		n := 0
		for _, line := range strings.Split(string(text), "\n") {
			m := extentRe.FindStringSubmatch(strings.TrimSpace(line))
			if m != nil && m[3] != "ZERO" {
				n++
				ext := m[4]
				extDst := fmt.Sprintf("%s-%s-e%d.vmdk", strings.TrimSuffix(path.Base(ext), ".vmdk"), tag, n)
				if err := copySparse(filepath.Join(filepath.Dir(src), ext), filepath.Join(filepath.Dir(src), extDst)); err != nil {
					return "", nil, err
				}
				created = append(created, filepath.Join(filepath.Dir(src), extDst))
				line = fmt.Sprintf("%s %s %s \"%s\"%s", m[1], m[2], m[3], extDst, m[5])
			}
			outLines = append(outLines, line)
		}
		if err := os.WriteFile(dst, []byte(strings.Join(outLines, "\n")), 0o644); err != nil {
			return "", nil, err
		}
		created = append(created, dst)
	}
	return fmt.Sprintf("[%s] %s", ds, dstRel), created, nil
}

// freezeSnapshot gives the snapshot its own disk copies and, with CBT on, new changeIds.
func freezeSnapshot(snap *simulator.VirtualMachineSnapshot) error {
	cbt.mu.Lock()
	n := cbt.taken[snap.Vm.Value]
	cbt.taken[snap.Vm.Value] = n + 1
	delta := cbt.deltaVMs[snap.Vm.Value]
	prev := cbt.last[snap.Vm.Value]
	cbt.mu.Unlock()
	writes, err := applyWrites(snap.Vm.Value, n)
	if err != nil {
		return err
	}
	tracking := snap.Config.ChangeTrackingEnabled != nil && *snap.Config.ChangeTrackingEnabled
	devices := make([]types.BaseVirtualDevice, 0, len(snap.Config.Hardware.Device))
	var created []string
	for _, d := range snap.Config.Hardware.Device {
		disk, ok := d.(*types.VirtualDisk)
		if !ok {
			devices = append(devices, d)
			continue
		}
		b, ok := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
		if !ok {
			devices = append(devices, d)
			continue
		}
		nb := *b
		var frozenPath string
		var files []string
		var pb *types.VirtualDiskFlatVer2BackingInfo
		if delta && prev != nil {
			pb = diskBacking(prev, disk.Key)
		}
		if pb != nil {
			_, rel, _ := dsPath(b.FileName)
			frozenPath, files, err = deltaDisk(b.FileName, pb.FileName, snap.Self.Value, writes[rel])
			parent := *pb
			nb.Parent = &parent
			cbt.mu.Lock()
			cbt.deltasMade[snap.Vm.Value]++
			cbt.mu.Unlock()
		} else {
			frozenPath, files, err = freezeDisk(b.FileName, snap.Self.Value)
		}
		if err != nil {
			return err
		}
		created = append(created, files...)
		nb.FileName = frozenPath
		nb.ChangeId = ""
		if tracking {
			cbt.mu.Lock()
			cbt.seq++
			id := fmt.Sprintf("52 6d 69 67 72 61 74 6f-72 %02x %02x/%d", disk.Key&0xff, cbt.seq&0xff, cbt.seq)
			rawPath := filepath.Join(cbt.stateDir, fmt.Sprintf("cbt-%d.raw", cbt.seq))
			cbt.mu.Unlock()
			ds, rel, _ := dsPath(frozenPath)
			out, err := exec.Command("qemu-img", "convert", "-f", "vmdk", "-O", "raw", filepath.Join(cbt.dsDirs[ds], rel), rawPath).CombinedOutput()
			if err != nil {
				return fmt.Errorf("qemu-img convert: %v: %s", err, out)
			}
			cbt.mu.Lock()
			cbt.raw[id] = rawPath
			cbt.vmIds[snap.Vm.Value] = append(cbt.vmIds[snap.Vm.Value], id)
			cbt.mu.Unlock()
			nb.ChangeId = id
		}
		nd := *disk
		nd.Backing = &nb
		devices = append(devices, &nd)
	}
	snap.Config.Hardware.Device = devices
	cbt.mu.Lock()
	cbt.frozen[snap.Self.Value] = created
	if delta {
		if prev != nil {
			cbt.parentOf[snap.Self.Value] = prev
		}
		cbt.last[snap.Vm.Value] = snap
	}
	cbt.mu.Unlock()
	return nil
}

// ---- QueryChangedDiskAreas ----

type qcdaRequest struct {
	This        types.ManagedObjectReference
	Snapshot    types.ManagedObjectReference
	DeviceKey   int32
	StartOffset int64
	ChangeId    string
	Order       []string
}

func parseQcda(body []byte) (*qcdaRequest, error) {
	dec := xml.NewDecoder(bytes.NewReader(body))
	req := &qcdaRequest{}
	depth, inside := 0, -1
	var cur string
	var text strings.Builder
	var attrType string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			depth++
			if t.Name.Local == "QueryChangedDiskAreas" {
				inside = depth
			} else if inside >= 0 && depth == inside+1 {
				cur = t.Name.Local
				text.Reset()
				attrType = ""
				for _, a := range t.Attr {
					if a.Name.Local == "type" {
						attrType = a.Value
					}
				}
				req.Order = append(req.Order, cur)
			}
		case xml.CharData:
			if cur != "" {
				text.Write(t)
			}
		case xml.EndElement:
			if inside >= 0 && depth == inside+1 && cur != "" {
				v := strings.TrimSpace(text.String())
				switch cur {
				case "_this":
					req.This = types.ManagedObjectReference{Type: attrType, Value: v}
				case "snapshot":
					req.Snapshot = types.ManagedObjectReference{Type: attrType, Value: v}
				case "deviceKey":
					fmt.Sscanf(v, "%d", &req.DeviceKey)
				case "startOffset":
					fmt.Sscanf(v, "%d", &req.StartOffset)
				case "changeId":
					req.ChangeId = v
				}
				cur = ""
			}
			depth--
		}
	}
	if inside < 0 {
		return nil, fmt.Errorf("no QueryChangedDiskAreas element")
	}
	return req, nil
}

func soapFault(w http.ResponseWriter, msg, faultType, inner string) {
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	w.WriteHeader(http.StatusInternalServerError)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body><soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>%s</faultstring><detail><%sFault xmlns="urn:vim25" xsi:type="%s">%s</%sFault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>`,
		html.EscapeString(msg), faultType, faultType, inner, faultType)
}

var qcdaOrder = []string{"_this", "snapshot", "deviceKey", "startOffset", "changeId"}

func serveQcda(w http.ResponseWriter, body []byte, page int64) {
	req, err := parseQcda(body)
	if err != nil {
		soapFault(w, "malformed request: "+err.Error(), "InvalidRequest", "")
		return
	}
	if strings.Join(req.Order, ",") != strings.Join(qcdaOrder, ",") {
		soapFault(w, "parameters out of schema order: "+strings.Join(req.Order, ","), "InvalidRequest", "")
		return
	}
	obj := simulator.Map.Get(req.Snapshot)
	snap, ok := obj.(*simulator.VirtualMachineSnapshot)
	if !ok || snap.Vm != req.This {
		soapFault(w, "snapshot not found", "ManagedObjectNotFound", fmt.Sprintf(`<obj type="VirtualMachineSnapshot">%s</obj>`, html.EscapeString(req.Snapshot.Value)))
		return
	}
	var disk *types.VirtualDisk
	for _, d := range snap.Config.Hardware.Device {
		if vd, ok := d.(*types.VirtualDisk); ok && vd.Key == req.DeviceKey {
			disk = vd
		}
	}
	if disk == nil {
		soapFault(w, "deviceKey", "InvalidArgument", "<invalidProperty>deviceKey</invalidProperty>")
		return
	}
	b := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
	cbt.mu.Lock()
	curRaw, okCur := cbt.raw[b.ChangeId]
	prevRaw, okPrev := cbt.raw[req.ChangeId]
	cbt.mu.Unlock()
	if b.ChangeId == "" || !okCur {
		soapFault(w, "change tracking is not active for this disk", "FileFault", "<file>"+html.EscapeString(b.FileName)+"</file>")
		return
	}
	if req.ChangeId != "*" && !okPrev {
		soapFault(w, "A specified parameter was not correct: changeId", "InvalidArgument", "<invalidProperty>changeId</invalidProperty>")
		return
	}
	capacity := disk.CapacityInBytes
	if req.StartOffset < 0 || req.StartOffset >= capacity {
		soapFault(w, "A specified parameter was not correct: startOffset", "InvalidArgument", "<invalidProperty>startOffset</invalidProperty>")
		return
	}
	length := capacity - req.StartOffset
	if length > page {
		length = page
	}
	areas, err := diffRange(curRaw, prevRaw, req.ChangeId == "*", req.StartOffset, length)
	if err != nil {
		soapFault(w, err.Error(), "FileFault", "")
		return
	}
	var sb strings.Builder
	for _, a := range areas {
		fmt.Fprintf(&sb, "<changedArea><start>%d</start><length>%d</length></changedArea>", a[0], a[1])
	}
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body><QueryChangedDiskAreasResponse xmlns="urn:vim25"><returnval><startOffset>%d</startOffset><length>%d</length>%s</returnval></QueryChangedDiskAreasResponse></soapenv:Body></soapenv:Envelope>`,
		req.StartOffset, length, sb.String())
}

// diffRange returns [start, length] areas of [off, off+n) where cur differs from prev (or, when
// all is set, where cur is not zero), in 64 KiB blocks, adjacent blocks merged.
func diffRange(cur, prev string, all bool, off, n int64) ([][2]int64, error) {
	fc, err := os.Open(cur)
	if err != nil {
		return nil, err
	}
	defer fc.Close()
	var fp *os.File
	if !all {
		if fp, err = os.Open(prev); err != nil {
			return nil, err
		}
		defer fp.Close()
	}
	a := make([]byte, blockSize)
	b := make([]byte, blockSize)
	zero := make([]byte, blockSize)
	var out [][2]int64
	for o := off; o < off+n; o += blockSize {
		l := int64(blockSize)
		if o+l > off+n {
			l = off + n - o
		}
		ra, _ := fc.ReadAt(a[:l], o)
		for i := ra; i < int(l); i++ {
			a[i] = 0
		}
		other := zero[:l]
		if fp != nil {
			rb, _ := fp.ReadAt(b[:l], o)
			for i := rb; i < int(l); i++ {
				b[i] = 0
			}
			other = b[:l]
		}
		if !bytes.Equal(a[:l], other) {
			if k := len(out); k > 0 && out[k-1][0]+out[k-1][1] == o {
				out[k-1][1] += l
			} else {
				out = append(out, [2]int64{o, l})
			}
		}
	}
	return out, nil
}

// ---- control API ----

type diskSpec struct {
	File          string `json:"file"` // relative to the datastore
	CapacityBytes int64  `json:"capacity_bytes"`
}

type nicSpec struct {
	Mac string `json:"mac"`
}

type vmSpec struct {
	Name           string     `json:"name"`
	GuestId        string     `json:"guest_id"`
	Firmware       string     `json:"firmware"`
	NumCPU         int32      `json:"num_cpu"`
	CoresPerSocket int32      `json:"cores_per_socket"`
	MemoryMB       int64      `json:"memory_mb"`
	Cbt            bool       `json:"cbt"`
	DeltaSnapshots bool       `json:"delta_snapshots"`
	PowerOn        bool       `json:"power_on"`
	Disks          []diskSpec `json:"disks"`
	Nics           []nicSpec  `json:"nics"`
}

type harness struct {
	client *govmomi.Client
	ds     string
	token  string
}

func (h *harness) createVM(ctx context.Context, spec vmSpec) (string, error) {
	finder := find.NewFinder(h.client.Client, false)
	dc, err := finder.DefaultDatacenter(ctx)
	if err != nil {
		return "", err
	}
	finder.SetDatacenter(dc)
	folders, err := dc.Folders(ctx)
	if err != nil {
		return "", err
	}
	hosts, err := finder.HostSystemList(ctx, "*")
	if err != nil || len(hosts) == 0 {
		return "", fmt.Errorf("no host: %v", err)
	}
	host := hosts[0]
	pool, err := host.ResourcePool(ctx)
	if err != nil {
		return "", err
	}
	network, err := finder.Network(ctx, "VM Network")
	if err != nil {
		return "", err
	}
	backing, err := network.EthernetCardBackingInfo(ctx)
	if err != nil {
		return "", err
	}
	var devices object.VirtualDeviceList
	scsi, _ := devices.CreateSCSIController("pvscsi")
	devices = append(devices, scsi)
	for _, n := range spec.Nics {
		card, err := devices.CreateEthernetCard("vmxnet3", backing)
		if err != nil {
			return "", err
		}
		if n.Mac != "" {
			c := card.(types.BaseVirtualEthernetCard).GetVirtualEthernetCard()
			c.MacAddress = n.Mac
			c.AddressType = string(types.VirtualEthernetCardMacTypeManual)
		}
		devices = append(devices, card)
	}
	change, err := devices.ConfigSpec(types.VirtualDeviceConfigSpecOperationAdd)
	if err != nil {
		return "", err
	}
	config := types.VirtualMachineConfigSpec{
		Name:                  spec.Name,
		GuestId:               spec.GuestId,
		Firmware:              spec.Firmware,
		NumCPUs:               spec.NumCPU,
		NumCoresPerSocket:     spec.CoresPerSocket,
		MemoryMB:              spec.MemoryMB,
		ChangeTrackingEnabled: types.NewBool(spec.Cbt),
		Files:                 &types.VirtualMachineFileInfo{VmPathName: fmt.Sprintf("[%s]", h.ds)},
		DeviceChange:          change,
	}
	task, err := folders.VmFolder.CreateVM(ctx, config, pool, host)
	if err != nil {
		return "", err
	}
	info, err := task.WaitForResult(ctx, nil)
	if err != nil {
		return "", err
	}
	ref := info.Result.(types.ManagedObjectReference)
	vm := simulator.Map.Get(ref).(*simulator.VirtualMachine)
	if spec.DeltaSnapshots {
		cbt.mu.Lock()
		cbt.deltaVMs[ref.Value] = true
		cbt.mu.Unlock()
	}
	// Attach the existing disk files directly: the simulator's device configuration insists on
	// a "-flat.vmdk" beside every disk, which a monolithicSparse disk does not have.
	var dsRef types.ManagedObjectReference
	for _, d := range vm.Datastore {
		dsRef = d
	}
	simulator.Map.WithLock(vm, func() {
		var ctrl *types.ParaVirtualSCSIController
		for _, d := range vm.Config.Hardware.Device {
			if c, ok := d.(*types.ParaVirtualSCSIController); ok {
				ctrl = c
			}
		}
		for i, ds := range spec.Disks {
			unit := int32(i)
			if unit >= 7 {
				unit++
			}
			key := int32(2000 + i)
			disk := &types.VirtualDisk{
				VirtualDevice: types.VirtualDevice{
					Key:           key,
					ControllerKey: ctrl.Key,
					UnitNumber:    &unit,
					DeviceInfo:    &types.Description{Label: fmt.Sprintf("Hard disk %d", i+1), Summary: fmt.Sprintf("%d KB", ds.CapacityBytes/1024)},
					Backing: &types.VirtualDiskFlatVer2BackingInfo{
						VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{FileName: fmt.Sprintf("[%s] %s", h.ds, ds.File), Datastore: &dsRef},
						DiskMode:                     string(types.VirtualDiskModePersistent),
						ThinProvisioned:              types.NewBool(true),
					},
				},
				CapacityInKB:    ds.CapacityBytes / 1024,
				CapacityInBytes: ds.CapacityBytes,
			}
			ctrl.Device = append(ctrl.Device, key)
			vm.Config.Hardware.Device = append(vm.Config.Hardware.Device, disk)
		}
		vm.Summary.Config.NumVirtualDisks = int32(len(spec.Disks))
	})
	if spec.PowerOn {
		t, err := object.NewVirtualMachine(h.client.Client, ref).PowerOn(ctx)
		if err != nil {
			return "", err
		}
		if err := t.Wait(ctx); err != nil {
			return "", err
		}
	}
	return ref.Value, nil
}

type snapInfo struct {
	Ref  string `json:"ref"`
	Name string `json:"name"`
}

func flatten(list []types.VirtualMachineSnapshotTree, out *[]snapInfo) {
	for _, s := range list {
		*out = append(*out, snapInfo{Ref: s.Snapshot.Value, Name: s.Name})
		flatten(s.ChildSnapshotList, out)
	}
}

func (h *harness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+h.token {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, "/harness/"), "/"), "/")
	writeJSON := func(v interface{}) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	switch {
	case r.Method == http.MethodGet && len(parts) == 1 && parts[0] == "stats":
		writeJSON(map[string]int64{"folder_bytes": folderBytes.Load()})
	case r.Method == http.MethodPost && len(parts) == 1 && parts[0] == "vms":
		var spec vmSpec
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&spec); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id, err := h.createVM(r.Context(), spec)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(map[string]string{"vm_id": id})
	case len(parts) >= 2 && parts[0] == "vms":
		ref := types.ManagedObjectReference{Type: "VirtualMachine", Value: parts[1]}
		vm, ok := simulator.Map.Get(ref).(*simulator.VirtualMachine)
		if !ok {
			http.Error(w, "no such vm", http.StatusNotFound)
			return
		}
		if r.Method == http.MethodGet && len(parts) == 2 {
			var res map[string]interface{}
			simulator.Map.WithLock(vm, func() {
				snaps := []snapInfo{}
				if vm.Snapshot != nil {
					flatten(vm.Snapshot.RootSnapshotList, &snaps)
				}
				values := map[string]string{}
				for _, v := range vm.CustomValue {
					if cv, ok := v.(*types.CustomFieldStringValue); ok {
						values[fmt.Sprint(cv.Key)] = cv.Value
					}
				}
				fields := map[string]string{}
				for _, f := range simulator.Map.CustomFieldsManager().Field {
					fields[fmt.Sprint(f.Key)] = f.Name
				}
				named := map[string]string{}
				for k, v := range values {
					named[fields[k]] = v
				}
				disks := []map[string]interface{}{}
				for _, d := range vm.Config.Hardware.Device {
					if vd, ok := d.(*types.VirtualDisk); ok {
						disks = append(disks, map[string]interface{}{"key": vd.Key, "file": vd.Backing.(types.BaseVirtualDeviceFileBackingInfo).GetVirtualDeviceFileBackingInfo().FileName})
					}
				}
				tracking := vm.Config.ChangeTrackingEnabled != nil && *vm.Config.ChangeTrackingEnabled
				cbt.mu.Lock()
				taken := cbt.taken[ref.Value]
				deltas := cbt.deltasMade[ref.Value]
				cbt.mu.Unlock()
				res = map[string]interface{}{
					"name": vm.Name, "power_state": vm.Runtime.PowerState, "annotation": vm.Config.Annotation,
					"custom_values": named, "snapshots": snaps, "change_tracking": tracking, "disks": disks, "snapshots_taken": taken, "delta_disks": deltas,
				}
			})
			writeJSON(res)
			return
		}
		if r.Method == http.MethodPost && len(parts) == 3 && parts[2] == "reset-cbt" {
			cbt.mu.Lock()
			for _, id := range cbt.vmIds[ref.Value] {
				if p, ok := cbt.raw[id]; ok {
					_ = os.Remove(p)
				}
				delete(cbt.raw, id)
			}
			delete(cbt.vmIds, ref.Value)
			cbt.mu.Unlock()
			writeJSON(map[string]bool{"ok": true})
			return
		}
		if r.Method == http.MethodPost && len(parts) == 3 && parts[2] == "writes" {
			var ws []guestWrite
			if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ws); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			cbt.mu.Lock()
			cbt.writes[ref.Value] = append(cbt.writes[ref.Value], ws...)
			cbt.mu.Unlock()
			writeJSON(map[string]bool{"ok": true})
			return
		}
		if r.Method == http.MethodPost && len(parts) == 3 && parts[2] == "ignore-shutdown" {
			ignoreShutdown.Store(ref.Value, true)
			writeJSON(map[string]bool{"ok": true})
			return
		}
		if r.Method == http.MethodPost && len(parts) == 3 && parts[2] == "disable" {
			// The simulator compares the Go method name ("CreateSnapshotTask" for "CreateSnapshot_Task").
			m := strings.Replace(r.URL.Query().Get("method"), "_Task", "Task", 1)
			simulator.Map.WithLock(vm, func() { vm.DisabledMethod = append(vm.DisabledMethod, m) })
			writeJSON(map[string]bool{"ok": true})
			return
		}
		http.Error(w, "not found", http.StatusNotFound)
	default:
		http.Error(w, "not found", http.StatusNotFound)
	}
}

// ignoreShutdown holds the VMs whose guest ignores ShutdownGuest (POST .../ignore-shutdown).
var ignoreShutdown sync.Map

// shutdownIgnored tells whether body is a ShutdownGuest call on a VM whose guest ignores it.
func shutdownIgnored(body []byte) bool {
	if !bytes.Contains(body, []byte("ShutdownGuest")) {
		return false
	}
	found := false
	ignoreShutdown.Range(func(k, _ interface{}) bool {
		if bytes.Contains(body, []byte(">"+k.(string)+"<")) {
			found = true
		}
		return !found
	})
	return found
}

// sdkMiddleware answers QueryChangedDiskAreas itself (after checking the session by replaying
// a CurrentTime call with the same cookie) and passes everything else to the simulator.
func sdkMiddleware(next http.Handler, page int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if shutdownIgnored(body) {
			// the guest got the request and does nothing (the session is not checked: tests only)
			w.Header().Set("Content-Type", "text/xml; charset=utf-8")
			_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><ShutdownGuestResponse xmlns="urn:vim25"></ShutdownGuestResponse></soapenv:Body></soapenv:Envelope>`)
			return
		}
		if !bytes.Contains(body, []byte("QueryChangedDiskAreas")) {
			next.ServeHTTP(w, r)
			return
		}
		probe := httptest.NewRequest(http.MethodPost, r.URL.String(), strings.NewReader(`<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><CurrentTime xmlns="urn:vim25"><_this type="ServiceInstance">ServiceInstance</_this></CurrentTime></soapenv:Body></soapenv:Envelope>`))
		for _, c := range r.Cookies() {
			probe.AddCookie(c)
		}
		probe.Header.Set("Content-Type", "text/xml")
		probe.Header.Set("SOAPAction", "urn:vim25/7.0")
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, probe)
		if rec.Code != http.StatusOK {
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		serveQcda(w, body, page)
	})
}

// folderBytes counts the bytes of datastore file bodies served under /folder (GET /harness/stats).
var folderBytes atomic.Int64

type countingWriter struct{ http.ResponseWriter }

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	folderBytes.Add(int64(n))
	return n, err
}

// countFolderBytes wraps the simulator's datastore file handler to count what it serves.
func countFolderBytes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(countingWriter{w}, r)
	})
}

// selfSigned makes the harness's TLS certificate: ECDSA P-256, self-signed (its own CA), for
// 127.0.0.1 and localhost, valid for a day. (The simulator's built-in test certificate has a
// 1024-bit RSA key, which OpenSSL's default security level refuses.)
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "vcsim harness", Organization: []string{"migrator tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "listen address (loopback)")
	user := flag.String("user", "administrator@vsphere.local", "user name")
	password := flag.String("password", "", "password (required)")
	stateDir := flag.String("state", "", "directory for the harness's changed block tracking state")
	page := flag.Int64("cbt-page", 8<<20, "bytes of disk one QueryChangedDiskAreas answer covers")
	flag.Parse()
	if *password == "" || *stateDir == "" {
		log.Fatal("-password and -state are required")
	}
	cbt.stateDir = *stateDir

	model := simulator.VPX()
	model.Datastore = 1
	if err := model.Create(); err != nil {
		log.Fatal(err)
	}
	cert, err := selfSigned()
	if err != nil {
		log.Fatal(err)
	}
	model.Service.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	model.Service.Listen = &url.URL{Host: *listen, User: url.UserPassword(*user, *password)}
	server := model.Service.NewServer()

	// Wrap the SOAP endpoints and add the control API on the same listener.
	mux := model.Service.ServeMux
	outer := http.NewServeMux()
	outer.Handle("/sdk", sdkMiddleware(mux, *page))
	h := &harness{token: *password}
	outer.Handle("/harness/", h)
	outer.Handle("/folder/", countFolderBytes(mux))
	outer.Handle("/", mux)
	server.Server.Config.Handler = outer

	var datastores []map[string]string
	for _, e := range simulator.Map.All("Datastore") {
		ds := e.(*simulator.Datastore)
		dir := ds.Info.GetDatastoreInfo().Url
		cbt.dsDirs[ds.Name] = dir
		datastores = append(datastores, map[string]string{"name": ds.Name, "dir": dir})
		if h.ds == "" {
			h.ds = ds.Name
		}
	}
	simulator.Map.AddHandler(snapshotHandler{})

	ctx := context.Background()
	u := *server.URL
	u.User = url.UserPassword(*user, *password)
	client, err := govmomi.NewClient(ctx, &u, true)
	if err != nil {
		log.Fatal(err)
	}
	h.client = client

	leaf := server.Certificate()
	sum := sha256.Sum256(leaf.Raw)
	var tp []string
	for _, b := range sum {
		tp = append(tp, fmt.Sprintf("%02X", b))
	}
	info := map[string]interface{}{
		"url":        (&url.URL{Scheme: server.URL.Scheme, Host: server.URL.Host, Path: server.URL.Path}).String(),
		"datacenter": "DC0",
		"datastores": datastores,
		"cert_pem":   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})),
		"thumbprint": strings.Join(tp, ":"),
	}
	line, _ := json.Marshal(info)
	fmt.Println(string(line))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	server.Close()
	model.Remove()
}
