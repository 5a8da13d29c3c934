/**
 * The part of s3rver's API (devDependency, no type declarations of its own) the S3 tests use:
 * a server started with `run()` and stopped with `close()`.
 */
declare module 's3rver' {
  interface S3rverOptions {
    address?: string
    port?: number
    directory?: string
    silent?: boolean
    vhostBuckets?: boolean
    configureBuckets?: Array<{ name: string }>
  }
  export default class S3rver {
    constructor(options: S3rverOptions)
    run(): Promise<unknown>
    close(): Promise<void>
  }
}
