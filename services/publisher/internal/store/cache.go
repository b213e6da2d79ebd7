package store

import (
	"container/list"
	"sync"
)

// DefaultCacheBytes bounds the decoded graphs kept in memory, counted by their encoded size.
const DefaultCacheBytes = 128 << 20

// cache keeps decoded drafts and versions so a 10,000-node graph is not decoded from JSON on
// every read (decoding dominates validating it). Entries are only ever looked up after the
// read transaction has confirmed what the key currently holds (a draft's revision, or that a
// version exists), so the cache can never answer for data the file no longer has. Values are
// shared between readers and must not be modified.
type cache struct {
	mu    sync.Mutex
	max   int
	size  int
	order *list.List // front: most recently used
	items map[string]*list.Element
}

type cacheEntry struct {
	key   string
	stamp int64 // a draft's revision; 0 for versions, which never change
	value any
	size  int
}

func newCache(maxBytes int) *cache {
	return &cache{max: maxBytes, order: list.New(), items: make(map[string]*list.Element)}
}

// get returns the value stored under key with stamp.
func (c *cache) get(key string, stamp int64) (any, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	if e.stamp != stamp {
		return nil, false
	}
	c.order.MoveToFront(el)
	return e.value, true
}

// put stores value under key, replacing what was there, and evicts the least recently used
// entries beyond the bound. A value larger than the whole bound is not kept.
func (c *cache) put(key string, stamp int64, value any, size int) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.remove(el)
	}
	if size > c.max {
		return
	}
	c.items[key] = c.order.PushFront(&cacheEntry{key: key, stamp: stamp, value: value, size: size})
	c.size += size
	for c.size > c.max {
		c.remove(c.order.Back())
	}
}

// drop removes one entry.
func (c *cache) drop(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.remove(el)
	}
}

// dropPrefix removes every entry whose key starts with prefix (a deleted graph).
func (c *cache) dropPrefix(prefix string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, el := range c.items {
		if len(key) >= len(prefix) && key[:len(prefix)] == prefix {
			c.remove(el)
		}
	}
}

// remove takes the entry at el out of the cache; c.mu is held.
func (c *cache) remove(el *list.Element) {
	e := el.Value.(*cacheEntry)
	c.order.Remove(el)
	delete(c.items, e.key)
	c.size -= e.size
}
