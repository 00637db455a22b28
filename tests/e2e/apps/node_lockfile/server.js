// The web keelway starts as `npm start`: it listens on 127.0.0.1:$PORT.
const express = require("express");

const app = express();
const greeting = "express";

app.get("/", (req, res) => {
  res.send(`${greeting} on ${req.hostname} (${process.env.KEELWAY_RELEASE})\n`);
});

app.listen(Number(process.env.PORT), "127.0.0.1");
