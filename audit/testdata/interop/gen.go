// Command gen writes cross-implementation test vectors for the audit log's Merkle tree and signed
// checkpoints, computed by Go's golang.org/x/mod/sumdb/tlog (RFC 6962/9162 hashing, inclusion
// and consistency proofs) and golang.org/x/mod/sumdb/note (C2SP signed notes, Ed25519). The Rust
// test audit/tests/interop.rs checks inferno-audit against the output. Regenerate with
// scripts/interop-vectors.sh (Debian: golang-go, golang-golang-x-mod-dev; no network).
package main

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// hashStore is an in-memory tlog.HashReader over the stored hashes of a tree.
type hashStore []tlog.Hash

func (s hashStore) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		out[i] = s[x]
	}
	return out, nil
}

type rootVector struct {
	Size int64  `json:"size"`
	Root string `json:"root"`
}

type inclusionVector struct {
	Index int64    `json:"index"`
	Size  int64    `json:"size"`
	Proof []string `json:"proof"`
}

type consistencyVector struct {
	Old   int64    `json:"old"`
	New   int64    `json:"new"`
	Proof []string `json:"proof"`
}

type noteVector struct {
	Seed     string `json:"seed"`
	Name     string `json:"name"`
	Verifier string `json:"verifier"`
	Text     string `json:"text"`
	Signed   string `json:"signed"`
}

type vectors struct {
	Generator   string              `json:"generator"`
	Leaves      []string            `json:"leaves"`
	LeafHashes  []string            `json:"leaf_hashes"`
	Roots       []rootVector        `json:"roots"`
	Inclusion   []inclusionVector   `json:"inclusion"`
	Consistency []consistencyVector `json:"consistency"`
	Note        noteVector          `json:"note"`
}

func hexes(hs []tlog.Hash) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = hex.EncodeToString(h[:])
	}
	return out
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	const n = 41
	var v vectors
	v.Generator = "golang.org/x/mod/sumdb/tlog and sumdb/note (audit/testdata/interop/gen.go)"
	var store hashStore
	for i := int64(0); i < n; i++ {
		data := []byte(fmt.Sprintf("inferno interop leaf %d", i))
		leaf := tlog.RecordHash(data)
		v.Leaves = append(v.Leaves, hex.EncodeToString(data))
		v.LeafHashes = append(v.LeafHashes, hex.EncodeToString(leaf[:]))
		stored, err := tlog.StoredHashesForRecordHash(i, leaf, store)
		must(err)
		store = append(store, stored...)
	}
	for size := int64(1); size <= n; size++ {
		root, err := tlog.TreeHash(size, store)
		must(err)
		v.Roots = append(v.Roots, rootVector{size, hex.EncodeToString(root[:])})
	}
	for _, size := range []int64{1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 40, 41} {
		for _, index := range []int64{0, 1, size / 2, size - 2, size - 1} {
			if index < 0 || index >= size {
				continue
			}
			proof, err := tlog.ProveRecord(size, index, store)
			must(err)
			v.Inclusion = append(v.Inclusion, inclusionVector{index, size, hexes(proof)})
		}
	}
	for _, pair := range [][2]int64{{1, 1}, {1, 2}, {1, 8}, {2, 5}, {3, 7}, {4, 8}, {5, 16}, {6, 33}, {7, 41}, {16, 32}, {17, 40}, {31, 41}, {40, 41}} {
		proof, err := tlog.ProveTree(pair[1], pair[0], store)
		must(err)
		v.Consistency = append(v.Consistency, consistencyVector{pair[0], pair[1], hexes(proof)})
	}

	// A checkpoint of the whole tree, signed with a fixed Ed25519 seed (signatures are
	// deterministic, so another implementation must produce the same bytes).
	seed := sha256.Sum256([]byte("inferno interop signing seed"))
	private := ed25519.NewKeyFromSeed(seed[:])
	public := private.Public().(ed25519.PublicKey)
	name := "inferno.example/interop"
	keyData := append([]byte{1}, public...)
	digest := sha256.Sum256(append([]byte(name+"\n"), keyData...))
	hash := binary.BigEndian.Uint32(digest[:4])
	skey := fmt.Sprintf("PRIVATE+KEY+%s+%08x+%s", name, hash, base64.StdEncoding.EncodeToString(append([]byte{1}, seed[:]...)))
	vkey := fmt.Sprintf("%s+%08x+%s", name, hash, base64.StdEncoding.EncodeToString(keyData))
	signer, err := note.NewSigner(skey)
	must(err)
	root, err := tlog.TreeHash(n, store)
	must(err)
	text := fmt.Sprintf("%s\n%d\n%s\n", name, n, base64.StdEncoding.EncodeToString(root[:]))
	signed, err := note.Sign(&note.Note{Text: text}, signer)
	must(err)
	verifier, err := note.NewVerifier(vkey)
	must(err)
	_, err = note.Open(signed, note.VerifierList(verifier))
	must(err)
	v.Note = noteVector{hex.EncodeToString(seed[:]), name, vkey, text, string(signed)}

	out, err := json.MarshalIndent(v, "", "  ")
	must(err)
	os.Stdout.Write(append(out, '\n'))
}
