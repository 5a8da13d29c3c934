/** TLS material for the test servers that speak HTTPS. */
import { execFileSync } from 'node:child_process'

/**
 * Writes a self-signed certificate valid for one day (`openssl req -x509`, RSA 2048, subject
 * `/CN=<commonName>`, with `subjectAltName=<san>` when given, e.g. `IP:127.0.0.1`) to `certFile`
 * and its unencrypted key to `keyFile` (PEM both).
 */
export function selfSignedCert(keyFile: string, certFile: string, commonName: string, san?: string): void {
  const args = ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', keyFile, '-out', certFile, '-days', '1', '-subj', `/CN=${commonName}`]
  if (san) args.push('-addext', `subjectAltName=${san}`)
  execFileSync('openssl', args, { stdio: 'ignore', timeout: 30_000 })
}
