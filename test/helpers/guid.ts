/** A GUID string (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, braces allowed) as its 16 bytes in the
 * mixed-endian layout of Microsoft and UEFI structures: the first three fields little-endian. */
export function guidBytes(g: string): Buffer {
  const b = Buffer.from(g.replace(/[-{}]/g, ''), 'hex')
  return Buffer.concat([
    Buffer.from(b.subarray(0, 4)).reverse(),
    Buffer.from(b.subarray(4, 6)).reverse(),
    Buffer.from(b.subarray(6, 8)).reverse(),
    b.subarray(8),
  ])
}
