/**
 * s3rver (the S3 test server of the remote-input tests) in a process of its own, for
 * bench/remote.ts: started by the bench on the host or in its shaped link's network namespace
 * (`ip netns exec`), so the server is neither in the bench's event loop nor on its side of the
 * link. Serves the bucket `bench` from `dir` on `host`:`port` with s3rver's built-in account
 * (`S3RVER`/`S3RVER`); prints `listening` once it accepts requests; stops on SIGTERM.
 *
 *   bun bench/s3-server.ts <dir> <host> <port>
 */
import S3rver from 's3rver'

const [dir, host, port] = process.argv.slice(2)
if (!dir || !host || !port) throw new Error('usage: s3-server.ts <dir> <host> <port>')
const s3 = new S3rver({ address: host, port: Number(port), directory: dir, silent: true, vhostBuckets: false, configureBuckets: [{ name: 'bench' }] })
await s3.run()
console.log('listening')
process.on('SIGTERM', () => {
  void s3.close().then(() => process.exit(0))
})
