import cerebro_db
return (f"cerebro_db version: {cerebro_db.__version__} (Apache MADlib's deep-learning "
        f"interface), {plpy.execute('SELECT pg_catalog.version() AS v')[0]['v']}")
