import pg from 'pg'

/** One connection to `url` for `work`, ended afterwards whatever happens. */
export async function withClient<T> (
  url: string,
  work: (client: pg.Client) => Promise<T>,
  options: Omit<pg.ClientConfig, 'connectionString'> = {}
): Promise<T> {
  const client = new pg.Client({ ...options, connectionString: url })
  await client.connect()
  try {
    return await work(client)
  } finally {
    await client.end()
  }
}
