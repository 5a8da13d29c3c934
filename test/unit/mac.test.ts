// The one MAC rule (lib/mac.ts) every source parser and the domain XML apply.
import { describe, expect, test } from 'bun:test'
import { normalizeMac } from '../../lib/mac.ts'

describe('normalizeMac', () => {
  test('the spellings sources use become lower-case colon pairs', () => {
    expect(normalizeMac('00:0C:29:AB:CD:EF')).toBe('00:0c:29:ab:cd:ef') // VMX, OVF
    expect(normalizeMac('00-15-5D-01-02-03')).toBe('00:15:5d:01:02:03') // Hyper-V
    expect(normalizeMac('080027C0FFEE')).toBe('08:00:27:c0:ff:ee') // VirtualBox, VMCX
    expect(normalizeMac(' 0050.5689.1234 ')).toBe('00:50:56:89:12:34') // Cisco dotted
  })

  test('not a unicast address: null', () => {
    expect(normalizeMac('00:00:00:00:00:00')).toBeNull() // Hyper-V dynamic, unassigned
    expect(normalizeMac('000000000000')).toBeNull()
    expect(normalizeMac('ff:ff:ff:ff:ff:ff')).toBeNull() // broadcast
    expect(normalizeMac('01:00:5e:00:00:01')).toBeNull() // multicast
    expect(normalizeMac('0:1:2:3:4:5')).toBeNull()
    expect(normalizeMac('00:0c:29:ab:cd')).toBeNull()
    expect(normalizeMac('00:0c:29:ab:cd:eg')).toBeNull()
    expect(normalizeMac('not-a-mac')).toBeNull()
    expect(normalizeMac('')).toBeNull()
    expect(normalizeMac(null)).toBeNull()
    expect(normalizeMac(undefined)).toBeNull()
  })
})
