/**
 * MAC addresses: the one rule every source parser and the domain XML apply to a NIC's address.
 */

/**
 * A lower-case unicast MAC `aa:bb:cc:dd:ee:ff`, or null when `mac` is not one.
 * Accepted spellings (surrounding blanks ignored, any case): six pairs of hex digits separated by
 * `:` or `-` (VMX, OVF, Hyper-V `00-15-5D-...`), twelve bare hex digits (VirtualBox, Hyper-V
 * VMCX), and Cisco's dotted `xxxx.xxxx.xxxx`. Refused: anything else, the all-zero address
 * (Hyper-V's "dynamic, not yet assigned") and group addresses (the I/G bit, multicast and
 * broadcast), which libvirt refuses for a guest NIC.
 */
export function normalizeMac(mac: string | null | undefined): string | null {
  if (!mac) return null
  const s = mac.trim()
  if (!/^[0-9a-f]{2}([:-][0-9a-f]{2}){5}$/i.test(s) && !/^[0-9a-f]{12}$/i.test(s) && !/^[0-9a-f]{4}(\.[0-9a-f]{4}){2}$/i.test(s)) return null
  const hex = s.replace(/[^0-9a-f]/gi, '').toLowerCase()
  if (/^0{12}$/.test(hex) || parseInt(hex.slice(0, 2), 16) & 1) return null
  return hex.match(/../g)!.join(':')
}
