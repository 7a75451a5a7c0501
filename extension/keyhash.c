/*-------------------------------------------------------------------------
 *
 * keyhash.c
 *		The 64-bit hash that names a key in the lock manager and in shared
 *		memory: the first 8 bytes of the key's SHA-256, and the lock tag
 *		built from it.
 *
 * The hash is SHA-256, not a fast hash: a fast hash would do for
 * spreading keys, but not against a role that computes a key whose lock
 * collides with a holder's (the key lock is shared then: its transactions
 * could hold the holder up).  For SHA-256 that is a second preimage of 64
 * bits: about 2^64 tries.
 *
 * PostgreSQL's pg_cryptohash API goes through OpenSSL's EVP layer when the
 * server is built with OpenSSL, as Debian's is: creating, initializing and
 * freeing a context there costs several times what hashing a key of a few
 * dozen bytes does, and a grant hashes every new key once.  So SHA-256
 * (FIPS 180-4) is written here from the standard; the regression test
 * lease_api checks it against the server's own sha256() through the lock
 * tags that pg_locks shows.
 *
 * Owns: the cache of the last keys hashed; how slot keys are named.
 * Calls nothing of dlock's.
 * (The lock tag of a hash is dlock_hash_locktag, inline in dlock.h.)
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"

#include "dlock.h"

/* Length of a SHA-256 digest, in bytes. */
#define SHA256_LEN	32

/* The first 32 bits of the fractional parts of the cube roots of the first
 * 64 primes (FIPS 180-4, 4.2.2). */
static const uint32 K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5,
	0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
	0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc,
	0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
	0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
	0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5,
	0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
	0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
};

#define ROTR(x, n)	(((x) >> (n)) | ((x) << (32 - (n))))

/* Process one 64-byte block into the state h[8] (FIPS 180-4, 6.2.2). */
static void
compress(uint32 h[8], const uint8 block[64])
{
	uint32		w[64];
	uint32		a,
				b,
				c,
				d,
				e,
				f,
				g,
				hh;
	int			t;

	for (t = 0; t < 16; t++)
		w[t] = ((uint32) block[4 * t] << 24) |
			((uint32) block[4 * t + 1] << 16) |
			((uint32) block[4 * t + 2] << 8) |
			(uint32) block[4 * t + 3];
	for (t = 16; t < 64; t++)
	{
		uint32		s0 = ROTR(w[t - 15], 7) ^ ROTR(w[t - 15], 18) ^ (w[t - 15] >> 3);
		uint32		s1 = ROTR(w[t - 2], 17) ^ ROTR(w[t - 2], 19) ^ (w[t - 2] >> 10);

		w[t] = w[t - 16] + s0 + w[t - 7] + s1;
	}

	a = h[0];
	b = h[1];
	c = h[2];
	d = h[3];
	e = h[4];
	f = h[5];
	g = h[6];
	hh = h[7];
	for (t = 0; t < 64; t++)
	{
		uint32		t1 = hh + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) +
			((e & f) ^ (~e & g)) + K[t] + w[t];
		uint32		t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) +
			((a & b) ^ (a & c) ^ (b & c));

		hh = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += hh;
}

/* Put the SHA-256 digest of data[0 .. len - 1] into digest. */
static void
sha256(const void *data, size_t len, uint8 digest[SHA256_LEN])
{
	/* the first 32 bits of the fractional parts of the square roots of
	 * the first 8 primes (FIPS 180-4, 5.3.3) */
	uint32		h[8] = {
		0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
		0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
	};
	const uint8 *p = data;
	size_t		left = len;
	uint8		last[128];
	size_t		nlast;
	uint64		bits = (uint64) len * 8;
	int			i;

	for (; left >= 64; left -= 64, p += 64)
		compress(h, p);

	/* the rest, a 1 bit, zeros, and the length in bits: one or two blocks */
	memset(last, 0, sizeof(last));
	memcpy(last, p, left);
	last[left] = 0x80;
	nlast = (left < 56) ? 64 : 128;
	for (i = 0; i < 8; i++)
		last[nlast - 1 - i] = (uint8) (bits >> (8 * i));
	compress(h, last);
	if (nlast == 128)
		compress(h, last + 64);

	for (i = 0; i < 8; i++)
	{
		digest[4 * i] = (uint8) (h[i] >> 24);
		digest[4 * i + 1] = (uint8) (h[i] >> 16);
		digest[4 * i + 2] = (uint8) (h[i] >> 8);
		digest[4 * i + 3] = (uint8) h[i];
	}
}

/* The first 8 bytes of key's SHA-256, as a 64-bit integer. */
static uint64
sha256_key_hash(const char *key, int len)
{
	uint8		digest[SHA256_LEN];
	uint64		h;

	sha256(key, len, digest);
	memcpy(&h, digest, sizeof(h));
	return h;
}

/*
 * The hashes of the last two keys hashed, kept for the backend: one call on
 * a key hashes it several times (its lock, its waiters, the wake-ups at
 * the end of the transaction), a slot key's locks hash its key too, and a
 * SHA-256 costs more than a key lookup.  A pure function of the key, so
 * the cache is never stale.
 */
static struct
{
	char		key[DLOCK_MAX_STORED_KEY_BYTES];
	int			len;
	uint64		hash;
}			recent[2] = {{"", -1, 0}, {"", -1, 0}};
static int	recent_next = 0;

/*
 * The 64-bit hash that names key in every lock space and in shared memory
 * (sha256_key_hash), from the cache when it can.
 */
uint64
dlock_key_hash(const char *key, int len)
{
	int			i;
	uint64		h;

	for (i = 0; i < 2; i++)
		if (len == recent[i].len && memcmp(key, recent[i].key, len) == 0)
			return recent[i].hash;
	h = sha256_key_hash(key, len);
	if (len <= DLOCK_MAX_STORED_KEY_BYTES)
	{
		memcpy(recent[recent_next].key, key, len);
		recent[recent_next].len = len;
		recent[recent_next].hash = h;
		recent_next ^= 1;
	}
	return h;
}

/*
 * Write into buf (DLOCK_MAX_STORED_KEY_BYTES + 1 bytes) the slot key of
 * slot (1 to DLOCK_MAX_SLOTS) of key (len bytes, a valid lock key), NUL
 * terminated; return its length.
 */
int
dlock_slot_key(char *buf, const char *key, int len, int slot)
{
	Assert(len <= DLOCK_MAX_KEY_BYTES && slot >= 1 && slot <= DLOCK_MAX_SLOTS);
	memcpy(buf, key, len);
	buf[len] = DLOCK_SLOT_SEPARATOR;
	return len + 1 + pg_ltoa(slot, buf + len + 1);
}

/* The length of the key part of key: all of it unless it is a slot key. */
int
dlock_base_key_len(const char *key, int len)
{
	const char *sep = memchr(key, DLOCK_SLOT_SEPARATOR, len);

	return sep == NULL ? len : (int) (sep - key);
}

/* The slot of a slot key, 0 for any other key. */
int
dlock_key_slot(const char *key, int len)
{
	int			base = dlock_base_key_len(key, len);
	int			slot = 0;
	int			i;

	for (i = base + 1; i < len; i++)
		slot = slot * 10 + (key[i] - '0');
	return slot;
}
