//go:build !unix

package freeport

// lock cannot lock across processes here, so Reserve reserves nothing.
func lock(string, int) (func(), bool) { return nil, false }
