package keys

// SlotCount is the number of hash slots in Redis Cluster.
const SlotCount = 16384

// Slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag when it has one (see [HashTag]), of the whole key otherwise,
// modulo 16384.
func Slot(key string) uint16 {
	if tag, ok := HashTag(key); ok {
		key = tag
	}
	return crc16(key) % SlotCount
}

// HashTag returns the text Redis Cluster hashes instead of the whole key:
// the bytes between the first '{' and the first '}' after it. ok is false
// when there is no such pair or the text between them is empty, in which
// case Redis hashes the whole key.
func HashTag(key string) (tag string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j == i+1 {
					return "", false
				}
				return key[i+1 : j], true
			}
		}
		return "", false
	}
	return "", false
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
