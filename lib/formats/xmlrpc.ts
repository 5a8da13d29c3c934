/**
 * XML-RPC value decoder: one `<value>` element of an already parsed XML tree (`xml.ts`) to a
 * plain value (string, number, boolean, null, array, `Map` for a `struct`). Generic: the XVA
 * `ova.xml` reader (`xva.ts`) is its user.
 *
 * Follows the XML-RPC specification (xmlrpc.com, "XML-RPC Specification": scalar types
 * `i4`/`int`, `boolean`, `string`, `double`, `dateTime.iso8601`, `base64`, a `<value>` of bare
 * text being a string, and the `struct` and `array` compounds), plus the widespread `i8` and
 * `nil` extensions. Hostile input: nesting depth and the number of values are bounded, and a
 * `struct` is a `Map`, so member names such as `__proto__` are plain keys.
 */
import { malformed } from './io.ts'
import { xmlChild, xmlChildren, type XmlNode } from './xml.ts'

/** Bounds on one XML-RPC document: nesting depth, values in all. */
const MAX_RPC_DEPTH = 64
const MAX_RPC_ITEMS = 1_000_000

/** An XML-RPC value: string (also `dateTime.iso8601`, `base64` text), number, boolean, null (`nil`), array, struct. */
export type XmlRpcValue = string | number | boolean | null | XmlRpcValue[] | XmlRpcStruct
/** An XML-RPC `struct`: a null-prototype-safe map of member names to values. */
export interface XmlRpcStruct extends Map<string, XmlRpcValue> {}

/**
 * Decodes one XML-RPC `<value>` element (XML-RPC spec: `i4`/`int`/`i8`, `boolean`, `string`,
 * `double`, `dateTime.iso8601`, `base64`, `struct`, `array`, `nil`; a `<value>` with text and no
 * type element is a string).
 *
 * @throws E_MIG_MALFORMED_ARCHIVE an unknown type element, a bad number or boolean, a `struct`
 *   member without `name`/`value`, nesting deeper than 64, more than 1 000 000 items.
 */
export function decodeXmlRpcValue(v: XmlNode, label: string, depth = 0, budget = { left: MAX_RPC_ITEMS }): XmlRpcValue {
  if (depth > MAX_RPC_DEPTH) throw malformed(label, 'XML-RPC value nested too deeply')
  if (--budget.left < 0) throw malformed(label, 'XML-RPC document has too many values')
  if (v.name !== 'value') throw malformed(label, `expected an XML-RPC <value>, found <${v.name}>`)
  if (v.children.length === 0) return v.text
  if (v.children.length !== 1) throw malformed(label, '<value> holds several elements')
  const t = v.children[0]!
  switch (t.name) {
    case 'string':
    case 'dateTime.iso8601':
    case 'base64':
      return t.text
    case 'i4':
    case 'int':
    case 'i8': {
      const s = t.text.trim()
      if (!/^[-+]?[0-9]{1,16}$/.test(s) || !Number.isSafeInteger(Number(s))) throw malformed(label, `bad XML-RPC integer ${JSON.stringify(s.slice(0, 40))}`)
      return Number(s)
    }
    case 'double': {
      const x = Number(t.text.trim())
      if (!Number.isFinite(x)) throw malformed(label, `bad XML-RPC double ${JSON.stringify(t.text.slice(0, 40))}`)
      return x
    }
    case 'boolean': {
      const s = t.text.trim()
      if (s === '1' || s === 'true') return true
      if (s === '0' || s === 'false') return false
      throw malformed(label, `bad XML-RPC boolean ${JSON.stringify(s.slice(0, 40))}`)
    }
    case 'nil':
      return null
    case 'array': {
      const data = xmlChild(t, 'data')
      if (!data) throw malformed(label, '<array> without <data>')
      return xmlChildren(data, 'value').map((c) => decodeXmlRpcValue(c, label, depth + 1, budget))
    }
    case 'struct': {
      const out: XmlRpcStruct = new Map()
      for (const m of xmlChildren(t, 'member')) {
        const name = xmlChild(m, 'name')
        const val = xmlChild(m, 'value')
        if (!name || !val) throw malformed(label, 'struct <member> without <name> or <value>')
        out.set(name.text, decodeXmlRpcValue(val, label, depth + 1, budget))
      }
      return out
    }
    default:
      throw malformed(label, `unknown XML-RPC type <${t.name}>`)
  }
}
